"""Fine-tuning ESM-2 on labelled sequences: tasks and their CSV files, heads, losses and metrics.

Importing it imports no torch: the tasks (:mod:`.tasks`) and head choices (:mod:`.head_config`) are loaded at
once, so input files and options are checked before anything heavy; the heads, objectives and metrics (torch,
torchmetrics) are loaded on first use.
"""

from typing import TYPE_CHECKING

from bionemo.core.lazy_exports import lazy_exports
from bionemo.esm2.finetune.head_config import (
    HEADS_EXPORTABLE_TO_HF,
    HEADS_FOR_TASK,
    HeadChoice,
    HeadConfig,
    HeadKind,
    head_config,
)
from bionemo.esm2.finetune.tasks import (
    LabelledRecord,
    LabelVocabulary,
    OptionError,
    Task,
    check_label_options,
    read_labelled_csv,
    split,
)

if TYPE_CHECKING:
    from bionemo.esm2.finetune.heads import ConvTokenHead, HFSequenceHead, HFTokenHead, MeanPoolMLPHead, build_head
    from bionemo.esm2.finetune.metric_names import BEST_METRIC, METRIC_NAMES, BestMetric, Mode
    from bionemo.esm2.finetune.metrics import TaskMetrics
    from bionemo.esm2.finetune.objectives import LossSum, csv_cells, loss_sum, predictions, targets

_LAZY = {
    "heads": ("ConvTokenHead", "HFSequenceHead", "HFTokenHead", "MeanPoolMLPHead", "build_head"),
    "metric_names": ("BEST_METRIC", "METRIC_NAMES", "BestMetric", "Mode"),
    "metrics": ("TaskMetrics",),
    "objectives": ("LossSum", "csv_cells", "loss_sum", "predictions", "targets"),
}

__all__ = [
    "BEST_METRIC",
    "HEADS_EXPORTABLE_TO_HF",
    "HEADS_FOR_TASK",
    "METRIC_NAMES",
    "BestMetric",
    "ConvTokenHead",
    "HFSequenceHead",
    "HFTokenHead",
    "HeadChoice",
    "HeadConfig",
    "HeadKind",
    "LabelVocabulary",
    "LabelledRecord",
    "LossSum",
    "MeanPoolMLPHead",
    "Mode",
    "OptionError",
    "Task",
    "TaskMetrics",
    "build_head",
    "check_label_options",
    "csv_cells",
    "head_config",
    "loss_sum",
    "predictions",
    "read_labelled_csv",
    "split",
    "targets",
]


__getattr__ = lazy_exports(__name__, _LAZY)
