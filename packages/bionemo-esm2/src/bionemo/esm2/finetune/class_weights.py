"""Class weights for imbalanced classes: ``--class-weights balanced``.

A head trained on 95% negatives learns to answer "negative" first; the cross-entropy of a rare class then weighs
as little as the class is rare. ``balanced`` weights each class by ``n / (k * n_c)`` (``n`` training items, ``k``
classes, ``n_c`` items of class ``c``), scikit-learn's ``class_weight="balanced"``: every class then contributes the
same total weight, and the weights' mean over the training items is 1, so the loss keeps its scale. Items are
sequences (classification) or scored residues (token-classification). A class with no training item (a
token-classification label character seen only on unscored residues) gets weight 0. Multilabel tasks weigh each
label's positives and negatives the same way, as two classes of that label: ``n / (2 n_1)`` and ``n / (2 n_0)``.

The loss of a batch is the sum of the weighted per-item losses divided by its item count
(:func:`bionemo.esm2.finetune.objectives.loss_sum`): the ``(sum, count)`` contract every reduction and layout
shares, whose mean over the training set is torch's weighted cross-entropy (``F.cross_entropy(weight=w)``) there.
Only the loss is weighted (training and ``val_loss``); the validation metrics, and so the exported weights' choice,
are not.

Standard library only at import (``bionemo run finetune --help`` lists :class:`ClassWeighting`).
"""

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from bionemo.esm2.finetune.tasks import LabelledRecord, LabelVocabulary, Task

if TYPE_CHECKING:
    import torch

__all__ = ["WEIGHTED_TASKS", "WEIGHTED_TASK_NAMES", "ClassWeighting", "ClassWeights"]

WEIGHTED_TASKS = (Task.CLASSIFICATION, Task.MULTILABEL, Task.TOKEN_CLASSIFICATION)
"""The tasks with classes to weigh (multilabel: each label's 0s and 1s)."""

WEIGHTED_TASK_NAMES = f"{', '.join(WEIGHTED_TASKS[:-1])} and {WEIGHTED_TASKS[-1]}"
"""Their names for messages: ``classification, multilabel and token-classification``."""


class ClassWeighting(StrEnum):
    """``--class-weights``: how the classes of a task in :data:`WEIGHTED_TASKS` weigh in the loss."""

    NONE = "none"
    """Every item weighs 1."""
    BALANCED = "balanced"
    """``n / (k * n_c)``: each class weighs the same in total."""


@dataclass(frozen=True)
class ClassWeights:
    """Loss weights per class, in the vocabulary's class order; multilabel: per label, for its 1s and its 0s."""

    weights: tuple[float, ...]
    """Classification tasks: one per class. Multilabel: one per label (column), for the items where it is 1."""
    negatives: tuple[float, ...] = ()
    """Multilabel: one per label, for the items where it is 0; empty for the classification tasks."""
    _on_device: dict[Any, "torch.Tensor"] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def balanced(cls, task: Task, records: Sequence[LabelledRecord], vocabulary: LabelVocabulary) -> "ClassWeights":
        """``n / (k * n_c)`` over the training ``records``.

        Token-classification counts their scored residues; multilabel each label's 0s and 1s (``k = 2``).

        Raises:
            ValueError: A task without classes, or records that hold no scored item.
        """
        task = Task(task)
        if task not in WEIGHTED_TASKS:
            raise ValueError(f"class weights are for {WEIGHTED_TASK_NAMES}, not {task}")
        if task is Task.MULTILABEL:
            columns = list(zip(*(vocabulary.encode(record) for record in records), strict=True))
            ones = [sum(1 for value in column if value > 0.5) for column in columns]
            n = len(records)
            return cls(
                tuple(n / (2 * k) if k else 0.0 for k in ones), tuple(n / (2 * (n - k)) if n - k else 0.0 for k in ones)
            )
        counts = [0] * len(vocabulary.classes)
        for record in records:
            encoded = vocabulary.encode(record)
            for i in (0,) if task is Task.CLASSIFICATION else record.scored():
                counts[int(encoded[i])] += 1
        total, present = sum(counts), sum(1 for count in counts if count)
        if total == 0:
            raise ValueError("no scored training item to weigh classes by")
        return cls(tuple(total / (present * count) if count else 0.0 for count in counts))

    def on(self, device: "torch.device") -> "torch.Tensor":
        """The weights in float32 on ``device``, copied there once (no host copy per step).

        ``[k]`` per class, or multilabel ``[2, k]`` (row 0 for the labels' 0s, row 1 for their 1s).
        """
        import torch

        if device not in self._on_device:
            values = [self.negatives, self.weights] if self.negatives else self.weights
            self._on_device[device] = torch.tensor(values, dtype=torch.float32, device=device)
        return self._on_device[device]

    def by_name(self, vocabulary: LabelVocabulary) -> dict[str, Any]:
        """``{class: weight}``, multilabel ``{label: {"0": weight, "1": weight}}`` (``summary.json``)."""
        if self.negatives:
            return {
                name: {"0": zero, "1": one}
                for name, zero, one in zip(vocabulary.columns, self.negatives, self.weights, strict=True)
            }
        return dict(zip(vocabulary.classes, self.weights, strict=True))

    def label(self, vocabulary: LabelVocabulary) -> str:
        """``hyd 0.62, pol 2.5`` (multilabel ``has_c 0/1 0.6/2.5, ...``), for the run's summary."""
        if self.negatives:
            return ", ".join(f"{name} 0/1 {w['0']:.3g}/{w['1']:.3g}" for name, w in self.by_name(vocabulary).items())
        return ", ".join(f"{name} {weight:.3g}" for name, weight in self.by_name(vocabulary).items())

    def to_json(self) -> str:
        """A JSON string; :meth:`from_json` reads it back."""
        return json.dumps({"weights": list(self.weights), "negatives": list(self.negatives)})

    @classmethod
    def from_json(cls, text: str) -> "ClassWeights | None":
        """The weights :meth:`to_json` wrote, or None for ``"null"``; one object per text (one device copy)."""
        return _from_json(text)


@functools.cache
def _from_json(text: str) -> ClassWeights | None:
    data = json.loads(text)
    if data is None:
        return None
    return ClassWeights(tuple(map(float, data["weights"])), tuple(map(float, data["negatives"])))
