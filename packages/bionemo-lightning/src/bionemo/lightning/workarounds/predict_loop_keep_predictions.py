"""``trainer.predict(..., return_predictions=False)`` under MegatronStrategy, holding one batch at a time.

Lightning 2.4.0's predict loop, when fed the dataloader iterator (as NeMo's MegatronStrategy does), assigns
``any_on_epoch`` only on the batch-fed path and reads it after every step: ``UnboundLocalError: any_on_epoch``
unless ``return_predictions=True`` short-circuits the read (``_PredictionLoop._predict_step``). With
``return_predictions=False`` the loop is told to keep predictions (:func:`keep_predictions`), each kept batch
is dropped again before the next one (:func:`drop_kept_predictions`), so memory stays at one batch, and at the
epoch's end, before the loop picks its return value, the flag goes back (:func:`stop_keeping_predictions`), so
``trainer.predict`` still returns ``None``.
"""

import lightning.pytorch as pl

from bionemo.lightning.workarounds.workaround import Patches, Workaround

__all__ = [
    "PREDICT_LOOP_KEEP_PREDICTIONS",
    "drop_kept_predictions",
    "keep_predictions",
    "stop_keeping_predictions",
]


def keep_predictions(trainer: pl.Trainer, patches: Patches) -> bool:
    """Make the predict loop keep predictions if it would not; ``True`` when it was changed."""
    loop = trainer.predict_loop
    if loop.return_predictions:
        return False
    patches.set(loop, "return_predictions", True)
    return True


def drop_kept_predictions(trainer: pl.Trainer) -> None:
    """Forget the predictions the loop kept so far (one list per dataloader)."""
    for kept in trainer.predict_loop._predictions:
        kept.clear()


def stop_keeping_predictions(trainer: pl.Trainer) -> None:
    """Forget the kept predictions and tell the loop to return none (at the predict epoch's end)."""
    drop_kept_predictions(trainer)
    trainer.predict_loop.return_predictions = False


PREDICT_LOOP_KEEP_PREDICTIONS = Workaround(
    name="predict_loop_keep_predictions",
    upstream="Lightning's predict loop raises UnboundLocalError 'any_on_epoch' when fed the dataloader iterator",
    verified={"lightning": "2.4.0"},
    sources={"lightning.pytorch.loops.prediction_loop:_PredictionLoop._predict_step": "7e182715f6358113"},
    stages=frozenset({"predict"}),
)
