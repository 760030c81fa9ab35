"""``bionemo.llm.lightning``: bionemo-llm's public names, so code written against it keeps importing."""

from bionemo.callbacks import PerplexityLoggingCallback
from bionemo.collate import batch_collator
from bionemo.core import DataStep, DataT, ForwardStep, ReductionT, get_dtype_device, some_first
from bionemo.lightning import BionemoLightningModule, LightningPassthroughPredictionMixin, default_megatron_optimizer
from bionemo.losses import PassthroughLossReduction

__all__ = [
    "BionemoLightningModule",
    "DataStep",
    "DataT",
    "ForwardStep",
    "LightningPassthroughPredictionMixin",
    "PassthroughLossReduction",
    "PerplexityLoggingCallback",
    "ReductionT",
    "batch_collator",
    "default_megatron_optimizer",
    "get_dtype_device",
    "some_first",
]
