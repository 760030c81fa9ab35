"""Fine-tuning ESM-2 on labelled sequences: tasks and their CSV files, and the head choices.

Importing it imports no torch: the tasks (:mod:`.tasks`) and head choices (:mod:`.head_config`) are checked before
anything heavy. The heads, objectives and metrics land as their own modules beside these.
"""

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

__all__ = [
    "HEADS_EXPORTABLE_TO_HF",
    "HEADS_FOR_TASK",
    "HeadChoice",
    "HeadConfig",
    "HeadKind",
    "LabelVocabulary",
    "LabelledRecord",
    "OptionError",
    "Task",
    "check_label_options",
    "head_config",
    "read_labelled_csv",
    "split",
]
