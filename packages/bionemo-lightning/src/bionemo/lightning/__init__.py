"""BionemoLightningModule and what it needs: optimizers, the pass-through prediction contract, data, compat."""

# First: lets megatron-core import on machines with nvcc but no GPU, before any submodule imports it.
from bionemo.lightning import _nemo  # noqa: F401  # isort: skip


from bionemo.lightning._nemo import MegatronOptimizerModule
from bionemo.lightning._parallel_init import ensure_model_parallel
from bionemo.lightning.data import MegatronDataModule
from bionemo.lightning.megatron_compat import MegatronCompatCallback
from bionemo.lightning.module import BionemoLightningModule
from bionemo.lightning.optimizer import default_megatron_optimizer, init_adam_state, torch_optimizer_from_config
from bionemo.lightning.prediction import LightningPassthroughPredictionMixin
from bionemo.lightning.rotary import RotarySelfAttention
from bionemo.lightning.sdpa_attention import (
    SDPACoreAttention,
    UnpaddedSequences,
    sdpa_layer_spec,
    varlen_attention_available,
)

__all__ = [
    "BionemoLightningModule",
    "LightningPassthroughPredictionMixin",
    "MegatronCompatCallback",
    "MegatronDataModule",
    "MegatronOptimizerModule",
    "RotarySelfAttention",
    "SDPACoreAttention",
    "UnpaddedSequences",
    "default_megatron_optimizer",
    "ensure_model_parallel",
    "init_adam_state",
    "sdpa_layer_spec",
    "torch_optimizer_from_config",
    "varlen_attention_available",
]
