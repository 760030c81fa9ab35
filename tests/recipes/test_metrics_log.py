"""metrics.csv holds a step's training row before that step's checkpoint exists, and holds it once; other loggers
get each row once too."""

import csv

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.loggers.logger import Logger

from bionemo.recipes.metrics_log import CSVLogPosition, ResumableCSVLogger


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).pow(2).mean()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(12, 2), batch_size=2)


class Recording(Logger):
    """Another logger beside the CSV one (TensorBoard in the recipes): the steps it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics, step=None):
        if "loss" in metrics:
            self.steps.append(step)

    def log_hyperparams(self, params, *args, **kwargs):
        pass


class SeesTheFile(Checkpoint):
    """Stands where a checkpoint is saved (Lightning runs Checkpoint callbacks last): what is on disk then."""

    def __init__(self, logger: ResumableCSVLogger) -> None:
        self.logger, self.seen = logger, []

    def on_train_batch_end(self, trainer, *args):
        with open(f"{self.logger.log_dir}/metrics.csv", newline="") as f:
            self.seen.append((trainer.global_step, [int(row["step"]) for row in csv.DictReader(f) if row["loss"]]))


def test_the_step_row_is_on_disk_when_its_checkpoint_is_saved_and_is_written_once(tmp_path):
    logger = ResumableCSVLogger(tmp_path, name="logs", version="", resume=False)
    sees, other = SeesTheFile(logger), Recording()
    trainer = pl.Trainer(
        max_steps=4, logger=[logger, other], callbacks=[sees, CSVLogPosition(logger)], log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(Tiny())
    assert sees.seen == [(step, list(range(step))) for step in range(1, 5)]
    with open(f"{logger.log_dir}/metrics.csv", newline="") as f:
        assert [int(row["step"]) for row in csv.DictReader(f)] == [0, 1, 2, 3]
    assert other.steps == [0, 1, 2, 3]
