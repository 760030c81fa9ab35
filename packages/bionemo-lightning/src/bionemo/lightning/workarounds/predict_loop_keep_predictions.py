"""``trainer.predict(..., return_predictions=False)`` under MegatronStrategy, keeping no prediction at all.

Lightning 2.4.0's predict loop, when fed the dataloader iterator (as NeMo's MegatronStrategy makes it:
its ``_data_fetcher_wrapper`` always selects ``_DataLoaderIterDataFetcher``), assigns ``any_on_epoch`` only on
the batch-fed path and reads it after every step: ``UnboundLocalError: any_on_epoch`` unless
``return_predictions=True`` short-circuits the read (``_PredictionLoop._predict_step``). But a loop that returns
predictions copies every batch's output to the host, ``move_data_to_device(predictions, "cpu")``, a blocking
copy beside the prediction writer's own non-blocking one.

So with ``return_predictions=False`` the loop is told to return predictions (:func:`keep_predictions`) and its
copy is replaced, for the run, by one that keeps nothing: the loop records ``None`` for each batch after the
callbacks' ``on_predict_batch_end`` (the writer) have had the output. At the epoch's end, before the loop picks
its return value, the records go and the flag goes back (:func:`stop_keeping_predictions`), so
``trainer.predict`` still returns ``None``. A caller who asks for ``return_predictions=True`` gets Lightning's
loop as it is.
"""

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loops import prediction_loop

from bionemo.lightning.workarounds.workaround import Patches, Workaround

__all__ = ["PREDICT_LOOP_KEEP_PREDICTIONS", "keep_predictions", "stop_keeping_predictions"]


def _keep_nothing(batch: Any, device: Any) -> None:
    """The loop's ``move_data_to_device`` while it only pretends to return predictions: no copy, ``None`` kept."""
    return


def keep_predictions(trainer: pl.Trainer, patches: Patches) -> bool:
    """Make the predict loop take the returning path, keeping nothing, if it would not; ``True`` when changed."""
    loop = trainer.predict_loop
    if loop.return_predictions:
        return False
    patches.set(loop, "return_predictions", True)
    patches.set(prediction_loop, "move_data_to_device", _keep_nothing)
    return True


def stop_keeping_predictions(trainer: pl.Trainer) -> None:
    """Forget what the loop recorded and tell it to return none (at the predict epoch's end)."""
    for kept in trainer.predict_loop._predictions:
        kept.clear()
    trainer.predict_loop.return_predictions = False


PREDICT_LOOP_KEEP_PREDICTIONS = Workaround(
    name="predict_loop_keep_predictions",
    upstream="Lightning's predict loop raises UnboundLocalError 'any_on_epoch' when fed the dataloader iterator",
    verified={"lightning": "2.4.0"},
    sources={"lightning.pytorch.loops.prediction_loop:_PredictionLoop._predict_step": "7e182715f6358113"},
    stages=frozenset({"predict"}),
)
