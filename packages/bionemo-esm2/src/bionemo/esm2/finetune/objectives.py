"""Per-task losses as (sum, count) pairs, targets in the heads' layout, and predictions decoded for CSV.

Shapes follow :mod:`bionemo.esm2.finetune.heads`: sequence tasks ``logits [b, k]``; token tasks
``logits [b, s, k]`` over the token positions (``<cls>`` at 0, residue ``i`` at ``i + 1``), though any leading
shape works (e.g. packed ``[t, k]``) as long as targets and mask share it.

A loss is returned as ``LossSum(total, num_items)``: the sum of per-item losses and how many items it covers, so a
reduction over micro-batches and data-parallel ranks divides the global sum by the global count (token tasks:
weighted by scored residues, not by sequences).
"""

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from bionemo.esm2.finetune.tasks import LabelledRecord, LabelVocabulary, Task

__all__ = ["LossSum", "csv_cells", "loss_sum", "predictions", "targets"]


class LossSum(NamedTuple):
    """A loss before its mean: ``total / num_items`` is the mean; both are 0-d tensors on the logits' device."""

    total: torch.Tensor
    """Sum of the per-item losses (float32)."""
    num_items: torch.Tensor
    """Number of items summed: sequences (sequence tasks) or scored residues (token tasks)."""


def loss_sum(
    task: Task,
    logits: torch.Tensor,
    target: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    class_weights: torch.Tensor | None = None,
) -> LossSum:
    """The task's loss summed over the items ``mask`` keeps, and their count.

    Args:
        task: The task.
        logits: The head's output: ``[b, k]`` (sequence tasks; ``k`` classes, labels or regression columns) or
            ``[..., k]`` per position (token-classification; token-regression ``[..., 1]`` or ``[...]``).
        target: classification ``[b]`` class indices; multilabel ``[b, k]`` 0/1; regression ``[b, k]``;
            token-classification ``[...]`` class indices; token-regression ``[...]`` values. Values where
            ``mask`` is False are ignored (any value, even an invalid class index or NaN).
        mask: Which items count: ``[b]`` (sequence tasks) or ``[...]`` (token tasks, True on scored residues);
            None counts everything (token tasks need a mask: their logits cover ``<cls>`` and padding too).
        scale: Regression tasks: each column's label spread ``[k]`` on the logits' device
            (:meth:`bionemo.esm2.finetune.label_scaling.LabelScaling.on`); errors are divided by it, so the squared
            error is the standardized one and every column weighs the same. None: 1.
        class_weights: On the logits' device (:mod:`bionemo.esm2.finetune.class_weights`): the classification
            tasks a weight per class ``[k]``, each item's cross-entropy times its class's; multilabel ``[2, k]``,
            each label's binary cross-entropy times row 0's weight where the label is 0, row 1's where it is 1.
            The count stays the item count. None: 1.

    Per item: classification cross-entropy; multilabel binary cross-entropy with logits, averaged over the
    labels; regression squared error averaged over the columns; token-classification cross-entropy and
    token-regression squared error per scored residue. Computed in float32.

    Raises:
        ValueError: A token task without a mask.
    """
    task = Task(task)
    logits = logits.float()
    if task is Task.TOKEN_REGRESSION and logits.shape[-1:] == (1,) and logits.dim() == target.dim() + 1:
        logits = logits.squeeze(-1)
    if mask is None:
        if task.per_residue:
            raise ValueError(f"{task} needs a mask of the scored residues (the logits cover every position)")
        mask = torch.ones(target.shape[0], dtype=torch.bool, device=logits.device)
    mask = mask.bool()
    # Masked items are zeroed rather than indexed out: boolean indexing would make the host wait for the device.
    logits = torch.where(_trailing_ones(mask, logits), logits, 0.0)
    if task in (Task.CLASSIFICATION, Task.TOKEN_CLASSIFICATION):
        classes = torch.where(mask, target.long(), -100).reshape(-1)
        items = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), classes, class_weights, reduction="sum", ignore_index=-100
        )  # with weights: the sum of each item's weighted cross-entropy
    else:
        values = torch.where(_trailing_ones(mask, target), target.float(), 0.0)
        if scale is not None and task in (Task.REGRESSION, Task.TOKEN_REGRESSION):
            spread = scale if task is Task.REGRESSION else scale.reshape(())
            logits, values = logits / spread, values / spread
        if task is Task.MULTILABEL:
            weight = None if class_weights is None else torch.where(values > 0.5, class_weights[1], class_weights[0])
            per_item = F.binary_cross_entropy_with_logits(logits, values, weight, reduction="none").mean(dim=-1)
        elif task is Task.REGRESSION:
            per_item = F.mse_loss(logits, values, reduction="none").mean(dim=-1)
        else:
            per_item = F.mse_loss(logits, values, reduction="none")
        items = torch.where(mask, per_item, 0.0).sum()
    return LossSum(items, mask.sum())


def _trailing_ones(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``mask`` with size-1 dimensions appended up to ``like``'s rank, so that it broadcasts over ``like``."""
    return mask.reshape(*mask.shape, *([1] * (like.dim() - mask.dim())))


def predictions(task: Task, logits: torch.Tensor) -> torch.Tensor:
    """What the logits predict, in float32.

    Classification and token-classification: softmax probabilities ``[..., k]``; multilabel: sigmoid
    probabilities ``[b, k]``; regression: the values ``[b, k]``; token-regression: the values ``[...]`` (a
    trailing size-1 dimension dropped).
    """
    task = Task(task)
    logits = logits.float()
    if task.categorical:
        return logits.softmax(dim=-1)
    if task is Task.MULTILABEL:
        return logits.sigmoid()
    if task is Task.TOKEN_REGRESSION and logits.shape[-1:] == (1,):
        return logits.squeeze(-1)
    return logits


def targets(
    task: Task, records: Sequence[LabelledRecord], vocabulary: LabelVocabulary, seq_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's targets and mask in the heads' layout (the inputs of :func:`loss_sum`).

    Sequence tasks: ``target`` ``[b]`` long (classification) or ``[b, k]`` float, ``mask`` ``[b]`` all True.
    Token tasks: ``[b, seq_len]`` (long class indices or float values) with residue ``i`` at position ``i + 1``
    (after ``<cls>``), and ``mask`` ``[b, seq_len]`` True on the scored residues only; ``seq_len`` defaults to
    the longest sequence plus 2 (``<cls>``, ``<eos>``).
    """
    task = Task(task)
    encoded = [vocabulary.encode(record) for record in records]
    b = len(records)
    if not task.per_residue:
        if task is Task.CLASSIFICATION:
            target = torch.tensor([e[0] for e in encoded], dtype=torch.long)
        else:
            target = torch.tensor(encoded, dtype=torch.float32).reshape(b, vocabulary.num_outputs)
        return target, torch.ones(b, dtype=torch.bool)
    width = seq_len if seq_len is not None else max(len(r.sequence) for r in records) + 2
    dtype = torch.long if task is Task.TOKEN_CLASSIFICATION else torch.float32
    target = torch.zeros(b, width, dtype=dtype)
    mask = torch.zeros(b, width, dtype=torch.bool)
    for row, (record, values) in enumerate(zip(records, encoded, strict=True)):
        n = len(record.sequence)
        if n + 2 > width:
            raise ValueError(f"seq_len {width} is shorter than sequence {record.id!r} ({n} residues + 2)")
        target[row, 1 : n + 1] = torch.tensor(values, dtype=dtype)
        mask[row, 1 : n + 1] = True if record.mask is None else torch.tensor(record.mask, dtype=torch.bool)
    return target, mask


def csv_cells(task: Task, prediction: torch.Tensor, vocabulary: LabelVocabulary) -> list[str]:
    """One sequence's ``predictions.csv`` cells, one per label column (``vocabulary.columns``).

    Args:
        task: The task.
        prediction: What :func:`predictions` gave for this sequence: sequence tasks ``[k]``; token tasks the
            residues' rows only, ``[n, k]`` (token-classification) or ``[n]`` (token-regression).
        vocabulary: The training set's labels.

    Cells: regression the value (7 significant digits, float32's precision); classification the class name;
    multilabel ``0``/``1`` (probability >= 0.5); token-classification one label character per residue;
    token-regression the residues' values, space-separated.
    """
    task = Task(task)
    values = prediction.detach().float().cpu()
    if task is Task.REGRESSION:
        return [_number(v) for v in values.tolist()]
    if task is Task.CLASSIFICATION:
        return [vocabulary.classes[int(values.argmax())]]
    if task is Task.MULTILABEL:
        return ["1" if p >= 0.5 else "0" for p in values.tolist()]
    if task is Task.TOKEN_CLASSIFICATION:
        return ["".join(vocabulary.classes[i] for i in values.argmax(dim=-1).tolist())]
    return [" ".join(_number(v) for v in values.reshape(-1).tolist())]


def _number(value: float) -> str:
    return f"{value:.7g}"
