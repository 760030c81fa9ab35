"""No ``global_batch_size`` logging by NeMo's data sampler while predicting.

NeMo 2.7.3's ``MegatronDataSampler.on_megatron_step_end`` logs ``global_batch_size`` through
``LightningModule.log`` after every step unless its ``output_log`` is off, and Lightning forbids logging in
``predict`` (``MisconfigurationException``). :func:`stop_sampler_log` switches ``output_log`` off for the
prediction; the callback's record switches it back at teardown (the sampler may serve a later ``fit``).
"""

import lightning.pytorch as pl

from bionemo.lightning.workarounds.workaround import Patches, Workaround

__all__ = ["PREDICT_WITHOUT_SAMPLER_LOG", "stop_sampler_log"]


def stop_sampler_log(trainer: pl.Trainer, patches: Patches) -> None:
    """Set the strategy's data sampler's ``output_log`` to ``False`` through ``patches`` (if it has one)."""
    sampler = getattr(trainer.strategy, "data_sampler", None)
    if sampler is not None and getattr(sampler, "output_log", False) and not patches.has(sampler, "output_log"):
        patches.set(sampler, "output_log", False)


PREDICT_WITHOUT_SAMPLER_LOG = Workaround(
    name="predict_without_sampler_log",
    upstream="NeMo's MegatronDataSampler.on_megatron_step_end calls LightningModule.log in predict",
    verified={"nemo-toolkit": "2.7.3"},
    sources={
        "nemo.lightning.pytorch.plugins.data_sampler:MegatronDataSampler.on_megatron_step_end": "67b12d5f82975b94",
    },
    stages=frozenset({"predict"}),
)
