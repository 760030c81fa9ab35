"""Int batch limits counted in optimizer steps under MegatronStrategy, as Lightning counts them elsewhere.

Under NeMo 2.7.3's ``MegatronStrategy`` an int ``limit_val_batches`` / ``num_sanity_val_steps`` counts
micro-batches, since the strategy's step consumes ``num_microbatches`` batches of the loader Lightning counts.
Below the micro-batches per step, validation silently never ran (the ``StopIteration`` is swallowed). At
``fit`` start they are multiplied by the micro-batches per step, unless the datamodule does this itself in
NeMo's ``reconfigure_limit_batches`` hook (as :class:`bionemo.lightning.data.MegatronDataModule` does, for
every stage, with :func:`bionemo.lightning.batch_limits.scale_limits_to_steps`): this work-around is the
fallback for other datamodules, and removing it removes nothing they rely on. The callback restores the given
limits at teardown.
"""

import lightning.pytorch as pl

from bionemo.lightning.batch_limits import is_batch_count
from bionemo.lightning.workarounds.workaround import Patches, Workaround

__all__ = ["LIMIT_BATCHES_TO_STEPS", "scale_fit_limits"]

_FIT_LIMITS = ("limit_val_batches", "num_sanity_val_steps")


def scale_fit_limits(trainer: pl.Trainer, patches: Patches) -> None:
    """Scale the trainer's int validation limits for ``fit`` through ``patches``, unless the datamodule does."""
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and hasattr(datamodule, "reconfigure_limit_batches"):
        return
    sampler = getattr(trainer.strategy, "data_sampler", None)
    micro_batches = getattr(sampler, "num_microbatches", None) or 1
    for name in _FIT_LIMITS:
        value = getattr(trainer, name)
        if is_batch_count(value) and not patches.has(trainer, name):
            patches.set(trainer, name, value * micro_batches)


LIMIT_BATCHES_TO_STEPS = Workaround(
    name="limit_batches_to_steps",
    upstream="an int limit_val_batches counts micro-batches under NeMo's MegatronStrategy, not steps",
    verified={"nemo-toolkit": "2.7.3", "lightning": "2.4.0"},
    sources={
        "nemo.lightning.pytorch.strategies.megatron_strategy:MegatronStrategy.validation_step": "bbb037a8208c0e8b",
        "lightning.pytorch.loops.fetchers:_DataLoaderIterDataFetcher.__next__": "cb9ee3f129336a4b",
    },
    stages=frozenset({"fit"}),
)
