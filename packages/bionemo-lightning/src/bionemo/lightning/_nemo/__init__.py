"""The NeMo adapter: the only code of ``bionemo.lightning`` that imports ``nemo``.

Nothing on the import path of :mod:`bionemo.lightning` imports it; it is imported when NeMo is used: when a
``MegatronStrategy`` trainer drives a module (:mod:`bionemo.lightning._nemo.step_runner`), when a
``MegatronDataModule`` serves one (data sampler, dataloaders), for NeMo's record of a module's constructor
arguments (:mod:`bionemo.lightning._nemo.io_capture`), and for ``MegatronOptimizerModule``.
"""

# First: lets megatron-core import on machines with nvcc but no GPU, before NeMo imports it.
from bionemo.lightning import _megatron_ready  # noqa: F401  # isort: skip

from nemo.lightning import io
from nemo.lightning.data import WrappedDataLoader
from nemo.lightning.megatron_parallel import MegatronStep
from nemo.lightning.pytorch.optim import MegatronOptimizerModule
from nemo.lightning.pytorch.plugins import MegatronDataSampler
from nemo.lightning.pytorch.strategies import MegatronStrategy

__all__ = [
    "MegatronDataSampler",
    "MegatronOptimizerModule",
    "MegatronStep",
    "MegatronStrategy",
    "WrappedDataLoader",
    "io",
]
