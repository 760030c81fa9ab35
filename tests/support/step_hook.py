"""A one-weight LightningModule that calls back at the start of every training step: for callback tests."""

from collections.abc import Callable

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

__all__ = ["StepHook"]


class StepHook(pl.LightningModule):
    """One weight fitted to eight ones, one per step; ``on_step(batch_idx)`` runs at the start of every step."""

    def __init__(self, on_step: Callable[[int], None]) -> None:
        """Call ``on_step`` with each training step's batch index."""
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.on_step = on_step

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        """``on_step(batch_idx)``, then the squared distance of the weight from the batch."""
        self.on_step(batch_idx)
        return (self.weight - batch).pow(2).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD."""
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        """Eight batches of one ``1.0``."""
        return DataLoader(torch.ones(8, 1), batch_size=1)
