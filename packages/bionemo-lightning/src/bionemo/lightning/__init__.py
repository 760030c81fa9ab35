"""BionemoLightningModule and what it needs: optimizers, the pass-through prediction contract, data, compat.

Importing it does not import NeMo: that happens when NeMo is used (a ``MegatronStrategy`` trainer, NeMo's
``MegatronOptimizerModule``, served here lazily; see :mod:`bionemo.lightning.step_runner`).
"""

# First: lets megatron-core import on machines with nvcc but no GPU, before any submodule imports it.
from bionemo.lightning import _megatron_ready  # noqa: F401  # isort: skip

from typing import TYPE_CHECKING, Any

from bionemo.layers import (  # re-exported for imports written before these moved to bionemo.layers
    RotarySelfAttention,
    SDPACoreAttention,
    UnpaddedSequences,
    sdpa_layer_spec,
    varlen_attention_available,
)
from bionemo.lightning._parallel_init import ensure_model_parallel
from bionemo.lightning.data import MegatronDataModule
from bionemo.lightning.megatron_compat import MegatronCompatCallback
from bionemo.lightning.module import BionemoLightningModule
from bionemo.lightning.optimizer import default_megatron_optimizer, init_adam_state, torch_optimizer_from_config
from bionemo.lightning.prediction import LightningPassthroughPredictionMixin
from bionemo.lightning.step_runner import LightningStepRunner, StepRunner, is_megatron_strategy

if TYPE_CHECKING:
    from bionemo.lightning._nemo import MegatronOptimizerModule

__all__ = [
    "BionemoLightningModule",
    "LightningPassthroughPredictionMixin",
    "LightningStepRunner",
    "MegatronCompatCallback",
    "MegatronDataModule",
    "MegatronOptimizerModule",
    "RotarySelfAttention",
    "SDPACoreAttention",
    "StepRunner",
    "UnpaddedSequences",
    "default_megatron_optimizer",
    "ensure_model_parallel",
    "init_adam_state",
    "is_megatron_strategy",
    "sdpa_layer_spec",
    "torch_optimizer_from_config",
    "varlen_attention_available",
]


def __getattr__(name: str) -> Any:
    """NeMo's ``MegatronOptimizerModule``, imported on first use (importing this package imports no NeMo)."""
    if name == "MegatronOptimizerModule":
        from bionemo.lightning._nemo import MegatronOptimizerModule

        return MegatronOptimizerModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
