"""A LightningModule that predicts from the dataloader iterator, as NeMo's MegatronStrategy makes Lightning do."""

import lightning.pytorch as pl
import torch


class IterPredictor(pl.LightningModule):
    """``predict_step(dataloader_iter)``: a linear layer over the next ``[n, 2]`` batch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def predict_step(self, dataloader_iter):
        batch, _, _ = next(dataloader_iter)
        return self.layer(batch)
