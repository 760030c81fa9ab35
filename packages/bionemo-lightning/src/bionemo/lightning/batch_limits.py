"""Int batch limits (``limit_val_batches``, ``num_sanity_val_steps``, ...) counted in optimizer steps.

Lightning counts an int limit in loader batches; a step of a megatron schedule consumes ``num_microbatches``
of them, so a limit meant in steps is that many times larger in batches.
"""

import lightning.pytorch as pl

__all__ = ["is_batch_count", "scale_limits_to_steps"]


def scale_limits_to_steps(trainer: pl.Trainer, names: tuple[str, ...], micro_batches: int) -> None:
    """Multiply the trainer's positive int limits ``names`` by ``micro_batches``, each once per trainer.

    Fractions (``0.5``: half the batches), ``0`` and ``None`` are left as they are.
    """
    done: set[str] = trainer.__dict__.setdefault("_bionemo_scaled_limits", set())
    for name in names:
        value = getattr(trainer, name)
        if name in done or not is_batch_count(value):
            continue
        setattr(trainer, name, value * micro_batches)
        done.add(name)


def is_batch_count(value: object) -> bool:
    """Whether a Trainer limit ``value`` is a count of batches (a positive int, not a bool or a fraction)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
