"""Class weights for imbalanced classification: ``--class-weights balanced``.

A head trained on 95% negatives learns to answer "negative" first; the cross-entropy of a rare class then weighs
as little as the class is rare. ``balanced`` weights each class by ``n / (k * n_c)`` (``n`` training items, ``k``
classes, ``n_c`` items of class ``c``), scikit-learn's ``class_weight="balanced"``: every class then contributes the
same total weight, and the weights' mean over the training items is 1, so the loss keeps its scale. Items are
sequences (classification) or scored residues (token-classification). A class with no training item (a
token-classification label character seen only on unscored residues) gets weight 0.

The loss of a batch is the sum of ``w_c * cross_entropy`` over its items divided by its item count
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

__all__ = ["ClassWeighting", "ClassWeights"]


class ClassWeighting(StrEnum):
    """``--class-weights``: how the classes of a classification task weigh in the loss."""

    NONE = "none"
    """Every item weighs 1."""
    BALANCED = "balanced"
    """``n / (k * n_c)``: each class weighs the same in total."""


@dataclass(frozen=True)
class ClassWeights:
    """One loss weight per class, in the vocabulary's class order."""

    weights: tuple[float, ...]
    _on_device: dict[Any, "torch.Tensor"] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def balanced(cls, task: Task, records: Sequence[LabelledRecord], vocabulary: LabelVocabulary) -> "ClassWeights":
        """``n / (k * n_c)`` over the training ``records`` (token-classification: their scored residues).

        Raises:
            ValueError: ``task`` is not a classification task, or the records hold no scored item.
        """
        task = Task(task)
        if task not in (Task.CLASSIFICATION, Task.TOKEN_CLASSIFICATION):
            raise ValueError(f"class weights are for classification and token-classification, not {task}")
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
        """The weights as a float32 ``[k]`` tensor on ``device``, copied there once (no host copy per step)."""
        import torch

        if device not in self._on_device:
            self._on_device[device] = torch.tensor(self.weights, dtype=torch.float32, device=device)
        return self._on_device[device]

    def label(self, classes: Sequence[str]) -> str:
        """``hyd 0.62, pol 2.5``: each class with its weight, for the run's summary."""
        return ", ".join(f"{name} {weight:.3g}" for name, weight in zip(classes, self.weights, strict=True))

    def to_json(self) -> str:
        """A JSON string; :meth:`from_json` reads it back."""
        return json.dumps(list(self.weights))

    @classmethod
    def from_json(cls, text: str) -> "ClassWeights | None":
        """The weights :meth:`to_json` wrote, or None for ``"null"``; one object per text (one device copy)."""
        return _from_json(text)


@functools.cache
def _from_json(text: str) -> ClassWeights | None:
    data = json.loads(text)
    return None if data is None else ClassWeights(tuple(float(w) for w in data))
