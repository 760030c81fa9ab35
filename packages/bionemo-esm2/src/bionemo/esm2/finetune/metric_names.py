"""The validation metrics' names per fine-tuning task, and the one that picks the exported weights (``--best-metric``).

Standard library only (the CLI's option checks read it before torch is imported); the metrics themselves are
:mod:`bionemo.esm2.finetune.metrics`.
"""

from dataclasses import dataclass
from enum import StrEnum

from bionemo.esm2.finetune.tasks import Task

__all__ = ["BEST_METRIC", "LOSS", "METRIC_NAMES", "BestMetric", "Mode", "best_metric"]


class Mode(StrEnum):
    """Whether a smaller or a larger value is better (Lightning's ``ModelCheckpoint(mode=...)``)."""

    MIN = "min"
    MAX = "max"


@dataclass(frozen=True, slots=True)
class BestMetric:
    """The validation metric that picks the best checkpoint and stops early, and which way is better."""

    key: str
    """The logged name, with the ``val_`` prefix."""
    mode: Mode
    """``max`` for the correlations and scores, ``min`` for ``mse`` and the loss."""


METRIC_NAMES: dict[Task, tuple[str, ...]] = {
    Task.REGRESSION: ("mse", "pearson", "spearman"),
    Task.CLASSIFICATION: ("accuracy", "f1_macro", "auroc", "mcc"),
    Task.MULTILABEL: ("auroc_micro", "auroc_macro", "f1_micro", "f1_macro"),
    Task.TOKEN_CLASSIFICATION: ("accuracy",),
    Task.TOKEN_REGRESSION: ("mse", "pearson", "spearman"),
}
"""Each task's metric names, without the prefix, in logging order."""

BEST_METRIC: dict[Task, BestMetric] = {
    Task.REGRESSION: BestMetric("val_spearman", Mode.MAX),
    Task.CLASSIFICATION: BestMetric("val_mcc", Mode.MAX),
    Task.MULTILABEL: BestMetric("val_auroc_macro", Mode.MAX),
    Task.TOKEN_CLASSIFICATION: BestMetric("val_accuracy", Mode.MAX),
    Task.TOKEN_REGRESSION: BestMetric("val_spearman", Mode.MAX),
}
"""Per task: rank correlation for regression (what fitness benchmarks report); MCC for classification (unlike
accuracy, not fooled by a majority class); macro AUROC for multilabel (threshold-free, every label weighs the
same); per-residue accuracy for token-classification (Q3/Q8 accuracy)."""

LOSS = "loss"
"""``--best-metric loss``: the validation loss (``val_loss``, smaller is better), which every task logs."""

_SMALLER_IS_BETTER = ("mse", LOSS)


def best_metric(task: Task, name: str | None) -> BestMetric:
    """The metric ``--best-metric name`` names for ``task``, with or without the ``val_`` prefix.

    None gives the task's default (:data:`BEST_METRIC`).

    Raises:
        ValueError: A name the task does not log; the message lists the valid ones.
    """
    task = Task(task)
    if name is None:
        return BEST_METRIC[task]
    short = name.strip().lower().removeprefix("val_")
    valid = (*METRIC_NAMES[task], LOSS)
    if short not in valid:
        raise ValueError(f"--best-metric {name!r}: --task {task} logs {', '.join(valid)}")
    return BestMetric(f"val_{short}", Mode.MIN if short in _SMALLER_IS_BETTER else Mode.MAX)
