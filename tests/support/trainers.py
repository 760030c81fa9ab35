"""Bare one-device trainers for tests: no logger, checkpoints, progress bar, model summary or sanity validation.

Keyword ``options`` are further Trainer arguments and override these defaults. nemo is imported only inside
:func:`megatron_trainer`.
"""

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl

__all__ = ["cpu_trainer", "megatron_trainer"]

_BARE: dict[str, Any] = {
    "devices": 1,
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
}


def cpu_trainer(callbacks: Sequence[pl.Callback] = (), **options: Any) -> pl.Trainer:
    """Lightning's Trainer on one CPU."""
    return pl.Trainer(**{**_BARE, "accelerator": "cpu", "callbacks": list(callbacks), **options})


def megatron_trainer(precision: str, callbacks: Sequence[pl.Callback] = (), **options: Any) -> pl.Trainer:
    """NeMo's Trainer on one GPU: MegatronStrategy without model parallelism or asynchronous checkpoints.

    Args:
        precision: Of nemo's ``MegatronMixedPrecision`` plugin, e.g. ``"32"`` or ``"bf16-mixed"``.
        callbacks: The trainer's callbacks.
        options: Further ``nl.Trainer`` arguments (``max_steps``, ``limit_val_batches``, ...).
    """
    from nemo import lightning as nl

    return nl.Trainer(
        **{
            **_BARE,
            "accelerator": "gpu",
            "strategy": nl.MegatronStrategy(ckpt_async_save=False),
            "plugins": nl.MegatronMixedPrecision(precision=precision),
            "use_distributed_sampler": False,
            "callbacks": list(callbacks),
            **options,
        }
    )
