"""Validation metrics per fine-tuning task (torchmetrics), named as logged, and the one that picks the best checkpoint.

Keys, with the default ``val_`` prefix:

- regression and token-regression: ``val_mse``, ``val_pearson``, ``val_spearman`` (token-regression over the
  scored residues; several regression columns: the mean over the columns);
- classification: ``val_accuracy``, ``val_f1_macro``, ``val_auroc`` (one-vs-rest, macro), ``val_mcc``
  (:class:`MatthewsCorrCoef`: 0 where it is undefined, e.g. a model that predicts one class for every sequence);
- multilabel: ``val_auroc_micro``, ``val_auroc_macro``, ``val_f1_micro``, ``val_f1_macro`` (0.5 threshold);
- token-classification: ``val_accuracy`` over the scored residues.

The states are summed (or gathered) across processes when computed, over ``process_group`` (default: all of
them). Processes holding the same samples (tensor-parallel ranks) change no value: every metric here is
unchanged when every sample is repeated the same number of times.
"""

import warnings
from typing import Any

import torch
from torch import nn
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassAUROC,
    MulticlassF1Score,
    MulticlassMatthewsCorrCoef,
    MultilabelAUROC,
    MultilabelF1Score,
)
from torchmetrics.regression import MeanSquaredError, PearsonCorrCoef, SpearmanCorrCoef

from bionemo.esm2.finetune.metric_names import BEST_METRIC, METRIC_NAMES, BestMetric, Mode
from bionemo.esm2.finetune.objectives import predictions
from bionemo.esm2.finetune.tasks import Task

__all__ = ["BEST_METRIC", "METRIC_NAMES", "BestMetric", "MatthewsCorrCoef", "Mode", "TaskMetrics", "matthews_corrcoef"]


def matthews_corrcoef(confmat: torch.Tensor) -> torch.Tensor:
    """The multiclass Matthews correlation coefficient of ``confmat`` [k, k] (rows: targets, columns: predictions).

    ``(c s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2) (s^2 - sum_k t_k^2))`` with ``c`` the correct predictions,
    ``s`` all of them, ``p_k`` / ``t_k`` the predictions / targets of class ``k``; computed in float64, returned as
    a float32 0-d tensor. Where the denominator is 0 (every prediction, or every target, of one class) it is 0, the
    coefficient's limit there and scikit-learn's value.
    """
    confmat = confmat.double()
    targets, predicted = confmat.sum(dim=1), confmat.sum(dim=0)
    total = confmat.sum()
    covariance = torch.trace(confmat) * total - (targets * predicted).sum()
    spread = (total.square() - predicted.square().sum()) * (total.square() - targets.square().sum())
    value = covariance / spread.sqrt() if spread > 0 else torch.zeros((), dtype=torch.float64, device=confmat.device)
    return value.float()


class MatthewsCorrCoef(MulticlassMatthewsCorrCoef):
    """torchmetrics' ``MulticlassMatthewsCorrCoef`` (its states and syncing) computing :func:`matthews_corrcoef`.

    torchmetrics 1.9 gives a two-class model that predicts one class for every sample +-0.80 instead of 0
    (its edge-case branch for a zero denominator; Lightning-AI/torchmetrics#3355): the best-validation choice
    (:data:`BEST_METRIC`, ``val_mcc``) would then pick such a degenerate model over ones that learned.
    """

    def compute(self) -> torch.Tensor:
        """The coefficient of the confusion matrix summed over every update (and process)."""
        return matthews_corrcoef(self.confmat)


class TaskMetrics(nn.Module):
    """The validation metrics of one task; a module, so it moves with the model to its device.

    ``update`` per validation batch, ``compute`` at the end of validation (a dict of 0-d tensors keyed as in the
    module docstring), ``reset`` before the next.
    """

    def __init__(self, task: Task, num_outputs: int, *, prefix: str = "val_", process_group: Any | None = None) -> None:
        """Metrics for ``task`` with ``num_outputs`` head outputs (``LabelVocabulary.num_outputs``).

        ``process_group`` is the group whose processes hold different samples (data-parallel), or None for all.
        """
        super().__init__()
        self.task = Task(task)
        self.num_outputs = num_outputs
        self.prefix = prefix
        with warnings.catch_warnings():  # validation sets are small: keeping every prediction is the point
            warnings.filterwarnings("ignore", message=".*will save all targets and predictions in the buffer")
            metrics = _metrics(self.task, num_outputs, {"process_group": process_group})
        self.collection = MetricCollection(metrics, prefix=prefix)

    def update(self, logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add a batch: the inputs of :func:`bionemo.esm2.finetune.objectives.loss_sum` (same shapes and mask).

        Token tasks need ``mask`` (True on the scored residues); the others may leave it None.
        """
        values = predictions(self.task, logits.detach())
        target = target.detach()
        if mask is not None:
            values, target = values[mask.bool()], target[mask.bool()]
        elif self.task.per_residue:
            raise ValueError(f"{self.task} needs a mask of the scored residues (the logits cover every position)")
        if self.task.categorical or self.task is Task.MULTILABEL:
            target = target.long()
        elif self.num_outputs == 1:  # torchmetrics' regression metrics take [n] for one output
            values, target = values.reshape(-1), target.reshape(-1).float()
        self.collection.update(values, target)

    def compute(self) -> dict[str, torch.Tensor]:
        """Every metric as a 0-d float tensor, keyed with the prefix, in :data:`METRIC_NAMES` order.

        Several regression columns give the mean of the per-column values.
        """
        values = self.collection.compute()
        return {self.prefix + name: values[self.prefix + name].float().mean() for name in METRIC_NAMES[self.task]}

    def reset(self) -> None:
        """Forget every update (before the next validation)."""
        self.collection.reset()


def _metrics(task: Task, k: int, kwargs: dict[str, Any]) -> dict[str, Metric | MetricCollection]:
    if task in (Task.REGRESSION, Task.TOKEN_REGRESSION):
        return {
            "mse": MeanSquaredError(num_outputs=k, **kwargs),
            "pearson": PearsonCorrCoef(num_outputs=k, **kwargs),
            "spearman": SpearmanCorrCoef(num_outputs=k, **kwargs),
        }
    if task is Task.CLASSIFICATION:
        return {
            "accuracy": MulticlassAccuracy(num_classes=k, average="micro", **kwargs),
            "f1_macro": MulticlassF1Score(num_classes=k, average="macro", **kwargs),
            "auroc": MulticlassAUROC(num_classes=k, average="macro", **kwargs),
            "mcc": MatthewsCorrCoef(num_classes=k, **kwargs),
        }
    if task is Task.MULTILABEL:
        return {
            "auroc_micro": MultilabelAUROC(num_labels=k, average="micro", **kwargs),
            "auroc_macro": MultilabelAUROC(num_labels=k, average="macro", **kwargs),
            "f1_micro": MultilabelF1Score(num_labels=k, average="micro", **kwargs),
            "f1_macro": MultilabelF1Score(num_labels=k, average="macro", **kwargs),
        }
    return {"accuracy": MulticlassAccuracy(num_classes=k, average="micro", **kwargs)}
