"""A run that asks for no checkpoint (``fit(ckpt_path=None)``, what ``--no-resume`` passes) starts afresh even with
InterruptCheckpoint among its callbacks and a checkpoint in that callback's folder."""

from bionemo.recipes.interrupts import InterruptCheckpoint
from support.step_hook import StepHook
from support.trainers import cpu_trainer


def test_fit_without_a_checkpoint_path_starts_at_step_zero(tmp_path):
    earlier = cpu_trainer([InterruptCheckpoint(tmp_path)], max_steps=2, enable_checkpointing=True)
    earlier.fit(StepHook(lambda batch_idx: None))
    earlier.save_checkpoint(tmp_path / "last.ckpt")  # the earlier run's checkpoint, where InterruptCheckpoint saves

    steps: list[int] = []
    fresh = cpu_trainer([InterruptCheckpoint(tmp_path)], max_steps=3, enable_checkpointing=True)
    fresh.fit(StepHook(steps.append), ckpt_path=None)
    assert steps == [0, 1, 2]  # resumed, it would have taken one step, batch 2
    assert fresh.global_step == 3
