"""The training progress bar reads `<step>/<max steps>`, also after a resume, not `Epoch 0/-2`."""

import io

import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel
from rich.console import Console

from bionemo.recipes.progress import StepProgressBar


class FirstShown(pl.Callback):
    """What the training bar showed when the first step of a fit began."""

    def __init__(self, bar: StepProgressBar) -> None:
        self.bar = bar
        self.completed: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.completed is None:
            assert self.bar.progress is not None
            assert self.bar.train_progress_bar_id is not None
            self.completed = self.bar.progress.tasks[self.bar.train_progress_bar_id].completed


def fit(max_steps: int, root, ckpt_path=None) -> tuple[StepProgressBar, FirstShown]:
    bar = StepProgressBar(leave=True)
    first = FirstShown(bar)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=max_steps, val_check_interval=2, limit_val_batches=3, callbacks=[bar, first],
        logger=False, enable_checkpointing=False, enable_model_summary=False, default_root_dir=root,
    )  # fmt: skip
    trainer.fit(BoringModel(), ckpt_path=ckpt_path)  # 64 training batches an epoch, max_epochs=-1
    trainer.save_checkpoint(root / "end.ckpt")
    return bar, first


def rendered(bar: StepProgressBar) -> str:
    console = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    assert bar.progress is not None
    console.print(bar.progress.get_renderable())
    return console.export_text()


def test_training_bar_shows_steps_out_of_max_steps(tmp_path):
    bar, first = fit(3, tmp_path)
    assert bar.progress is not None
    assert bar.train_progress_bar_id is not None
    task = bar.progress.tasks[bar.train_progress_bar_id]
    assert (task.completed, task.total) == (3, 3)
    assert first.completed == 0
    text = rendered(bar)
    assert "Training step" in text
    assert "3/3" in text
    assert "/-" not in text
    assert "Epoch" not in text
    # the validation bar (hidden once validation ends) counts validation batches, as Lightning's does
    assert bar.val_progress_bar_id is not None
    val = bar.progress.tasks[bar.val_progress_bar_id]
    assert val.description.endswith("Validation   ")
    assert val.total == 3


def test_a_resumed_run_starts_at_the_checkpoints_step(tmp_path):
    fit(2, tmp_path)
    bar, first = fit(5, tmp_path, ckpt_path=tmp_path / "end.ckpt")
    assert first.completed == 2
    assert bar.progress is not None
    assert bar.train_progress_bar_id is not None
    task = bar.progress.tasks[bar.train_progress_bar_id]
    assert (task.completed, task.total) == (5, 5)
    assert "5/5" in rendered(bar)
