"""The trainer of a recipe's training run: its own callbacks, then the periodic and Ctrl-C checkpoints, logs, bar.

Imports Lightning: import this module inside commands, not at ``bionemo --help`` time.
"""

from pathlib import Path
from typing import Any

from bionemo.recipes.settings import RunSettings

__all__ = ["training_trainer"]


def training_trainer(
    settings: RunSettings,
    *,
    out: Path,
    checkpoints: Path,
    max_steps: int,
    interval: int,
    resume_from: str | None,
    callbacks: list[Any],
) -> Any:
    """A trainer for ``max_steps`` with ``callbacks`` first, then what every training run has.

    Those are: Ctrl-C / SIGTERM checkpoints (every rank stops after the same step and saves what a rerun resumes
    from), a checkpoint and a validation every ``interval`` steps into ``checkpoints``, CSV and TensorBoard logs
    under ``out/logs`` (a resumed run, or a rerun of a finished one, continues ``metrics.csv``), a step progress bar
    and the one-line duration estimate.
    """
    from lightning.pytorch.loggers import TensorBoardLogger

    from bionemo.recipes.checkpoints import checkpoint_callback, interrupt_checkpoint
    from bionemo.recipes.duration import DurationEstimate
    from bionemo.recipes.metrics_log import CSVLogPosition, ResumableCSVLogger
    from bionemo.recipes.progress import StepProgressBar
    from bionemo.recipes.trainers import build_trainer

    csv_logger = ResumableCSVLogger(out, name="logs", version="", resume=resume_from is not None)
    return build_trainer(
        settings,
        training=True,
        callbacks=[
            *callbacks,
            interrupt_checkpoint(settings, checkpoints),
            checkpoint_callback(settings, checkpoints, every_n_train_steps=interval),
            CSVLogPosition(csv_logger),
            StepProgressBar(leave=True),
            DurationEstimate(),  # "about N steps/s: max_steps in about ..." once, after the first steps
        ],
        logger=[csv_logger, TensorBoardLogger(out, name="logs", version="")],
        max_steps=max_steps,
        val_check_interval=interval,
        default_root_dir=out,
    )
