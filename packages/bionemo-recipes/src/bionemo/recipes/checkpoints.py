"""Training checkpoints that a rerun resumes from (unless ``--no-resume``), on Lightning's strategies and megatron's.

Imports Lightning: import this module inside commands, not at ``bionemo --help`` time.
"""

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from bionemo.recipes.interrupts import InterruptCheckpoint
from bionemo.recipes.run_record import whole_checkpoint
from bionemo.recipes.settings import RunSettings
from bionemo.recipes.trainers import uses_megatron

__all__ = ["StepCheckpoint", "checkpoint_callback", "interrupt_checkpoint", "resume_checkpoint"]


class StepCheckpoint(ModelCheckpoint):
    """A ModelCheckpoint that names and ranks checkpoints by the trainer's global step (optimizer steps taken).

    Lightning takes ``step`` from the logged metrics when there is one, and NeMo's MegatronStrategy logs
    ``step`` before the optimizer step: one lower than the steps the checkpoint holds.
    """

    def _monitor_candidates(self, trainer: Any) -> dict[str, torch.Tensor]:
        candidates = super()._monitor_candidates(trainer)
        candidates["step"] = torch.tensor(trainer.global_step)
        return candidates


def checkpoint_callback(settings: RunSettings, dirpath: Path, every_n_train_steps: int) -> StepCheckpoint:
    """A checkpoint callback whose output :func:`resume_checkpoint` finds whole.

    Lightning's strategies write ``last.ckpt`` atomically (a temporary file, then a rename). MegatronStrategy
    writes a distributed checkpoint *directory*, into the same one again when the name repeats, so there the
    two newest ``step<N>`` directories are kept and a save cut short never replaces the previous one.
    """
    common: dict[str, Any] = {
        "dirpath": dirpath,
        "filename": "step{step}",
        "every_n_train_steps": every_n_train_steps,
        "auto_insert_metric_name": False,
    }
    if uses_megatron(settings):
        return StepCheckpoint(monitor="step", mode="max", save_top_k=2, **common)
    return StepCheckpoint(save_last=True, save_top_k=0, **common)


def interrupt_checkpoint(settings: RunSettings, dirpath: Path) -> InterruptCheckpoint:
    """The checkpoint saved on Ctrl-C or SIGTERM, named so that :func:`resume_checkpoint` picks it next.

    Lightning's strategies: ``last.ckpt``, written atomically like the periodic one. MegatronStrategy: a
    ``step<N>`` directory beside the periodic ones (outside their keep-two rotation), whole once its
    ``metadata.json`` is written.
    """
    return InterruptCheckpoint(dirpath, "step{step}" if uses_megatron(settings) else "last")


def resume_checkpoint(settings: RunSettings, dirpath: Path) -> str | None:
    """The checkpoint :func:`checkpoint_callback` wrote last and completely in ``dirpath``, or None.

    Lightning's ``last.ckpt``, or under MegatronStrategy the newest whole ``step<N>/``
    (:func:`bionemo.recipes.run_record.whole_checkpoint`). Which run wrote it is not checked here: a run's own
    checkpoints are told from another run's by :func:`bionemo.recipes.run_record.check_resumable`.
    """
    found = whole_checkpoint(dirpath, megatron=uses_megatron(settings))
    return None if found is None else str(found)
