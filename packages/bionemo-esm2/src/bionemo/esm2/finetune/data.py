"""Labelled sequences as fine-tuning batches: tokens, targets in the heads' layout and which items are scored.

Batches come by count (:class:`LabelledDataset`: one record per item, ``micro_batch_size`` items per micro-batch)
or by tokens (:class:`~bionemo.esm2.data.token_batches.TokenBatches` over a record dataset,
:class:`TokenBatchedDataset`: one micro-batch per item).

Each record's item is ``tokens [L + 2]`` (``<cls>`` residues ``<eos>``), ``target`` and ``target_mask`` as
:func:`bionemo.esm2.finetune.objectives.targets` lays them out (token tasks: residue ``i`` at position ``i + 1``),
and ``sample_index``. :func:`collate_labelled` right-pads a batch and adds ``attention_mask``, ``residue_mask`` and
the host-side ``host_lengths`` that :func:`bionemo.esm2.data.mlm.data_step` and the unpadded path read.
"""

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from bionemo.esm2.data.token_batches import GROUPS_PER_BUCKET, TokenBatches, collate_flat, split_evenly
from bionemo.esm2.finetune.objectives import targets
from bionemo.esm2.finetune.tasks import LabelledRecord, LabelVocabulary
from bionemo.esm2.tokenizer import ProteinTokenizer, encoded_length

__all__ = [
    "GROUPS_PER_BUCKET",
    "LabelledDataset",
    "TokenBatchedDataset",
    "TokenBatches",
    "collate_flat",
    "collate_labelled",
    "residue_mask",
    "split_evenly",
    "token_batched",
]


class LabelledDataset(Dataset):
    """Labelled records as model inputs and targets.

    With ``length`` larger than the number of records (training: ``max_steps x global batch``), item ``k`` is
    record ``order_e[k % n]`` where ``order_e`` is an order of the records drawn for pass ``e = k // n`` from
    ``seed``: every pass sees each record once, in a new order, the same on every layout and after a resume.
    With ``group_size`` (the global batch) that order groups similar lengths: the pass's permutation is cut into
    buckets of :data:`GROUPS_PER_BUCKET` groups, each bucket is sorted by length and cut into groups of
    ``group_size``, and the groups are shuffled, so a global batch pads little and its micro-batches less (the
    samples of a step are still a random draw of the data, in random steps). Without ``length`` (validation,
    prediction) item ``k`` is record ``k``.
    """

    def __init__(
        self,
        records: Sequence[LabelledRecord],
        vocabulary: LabelVocabulary,
        *,
        seed: int = 0,
        length: int | None = None,
        group_size: int | None = None,
        tokenizer: ProteinTokenizer | None = None,
    ) -> None:
        if not records:
            raise ValueError("a LabelledDataset needs at least one record")
        if group_size is not None and group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        self.records = list(records)
        self.vocabulary = vocabulary
        self.seed = seed
        self.length = len(self.records) if length is None else length
        self.shuffled = length is not None
        self.group_size = group_size
        self.tokenizer = tokenizer or ProteinTokenizer()
        self._orders: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return self.length

    def record_index(self, item: int) -> int:
        """Which record item ``item`` is."""
        n = len(self.records)
        if not self.shuffled:
            return item
        epoch = item // n
        order = self._orders.get(epoch)
        if order is None:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(n, generator=generator).tolist()
            if self.group_size is not None:
                order = self._grouped(order, generator)
            self._orders[epoch] = order
        return order[item % n]

    def _grouped(self, order: list[int], generator: torch.Generator) -> list[int]:
        """``order`` with similar lengths in each group of ``group_size`` (see the class docstring)."""
        assert self.group_size is not None
        size = self.group_size
        bucket = size * GROUPS_PER_BUCKET
        groups: list[list[int]] = []
        for start in range(0, len(order), bucket):
            ranked = sorted(order[start : start + bucket], key=lambda i: len(self.records[i].sequence))
            groups += [ranked[k : k + size] for k in range(0, len(ranked), size)]
        shuffled = torch.randperm(len(groups), generator=generator).tolist()
        return [i for g in shuffled for i in groups[g]]

    def record_tokens(self, index: int) -> int:
        """Tokens of record ``index``: its residues, ``<cls>`` and ``<eos>``."""
        return encoded_length(self.records[index].sequence)

    def item_tokens(self, item: int) -> int:
        """Tokens of item ``item``."""
        return self.record_tokens(self.record_index(item))

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        return self.record_item(self.record_index(item))

    def record_item(self, index: int) -> dict[str, torch.Tensor]:
        """Record ``index`` as model inputs and targets (see the module docstring)."""
        record = self.records[index]
        tokens = self.tokenizer.encode(record.sequence)
        target, mask = targets(self.vocabulary.task, [record], self.vocabulary, seq_len=tokens.shape[0])
        return {"tokens": tokens, "target": target[0], "target_mask": mask[0], "sample_index": torch.tensor(index)}


def residue_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[b, s]`` True on residues: real tokens but ``<cls>`` (position 0) and each row's last real one (``<eos>``)."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    eos = attention_mask.sum(dim=1, keepdim=True) - 1
    return attention_mask.bool() & (positions > 0) & (positions < eos)


def collate_labelled(items: list[dict[str, torch.Tensor]], pad_id: int) -> dict[str, Any]:
    """Right-pad items into ``tokens [b, s]``; per-residue targets and masks padded alike (0, False).

    Sequence targets are stacked (``[b]`` class indices or ``[b, k]`` values). Adds ``attention_mask`` (True on
    real tokens), ``residue_mask`` (:func:`residue_mask`) and ``host_lengths`` (a list: no strategy moves it).
    """
    lengths = [item["tokens"].shape[0] for item in items]
    length = max(lengths)
    b = len(items)
    tokens = torch.full((b, length), pad_id, dtype=items[0]["tokens"].dtype)
    attention = torch.zeros(b, length, dtype=torch.bool)
    for row, (item, n) in enumerate(zip(items, lengths, strict=True)):
        tokens[row, :n] = item["tokens"]
        attention[row, :n] = True
    per_residue = items[0]["target_mask"].dim() == 1
    if per_residue:
        target = torch.zeros(b, length, dtype=items[0]["target"].dtype)
        target_mask = torch.zeros(b, length, dtype=torch.bool)
        for row, (item, n) in enumerate(zip(items, lengths, strict=True)):
            target[row, :n] = item["target"]
            target_mask[row, :n] = item["target_mask"]
    else:
        target = torch.stack([item["target"] for item in items])
        target_mask = torch.stack([item["target_mask"] for item in items])
    return {
        "tokens": tokens,
        "attention_mask": attention,
        "residue_mask": residue_mask(attention),
        "target": target,
        "target_mask": target_mask,
        "sample_index": torch.stack([item["sample_index"] for item in items]),
        "host_lengths": lengths,
    }


class TokenBatchedDataset(Dataset):
    """One micro-batch per item: item ``i`` is the list of ``base``'s records :class:`TokenBatches` gives it.

    ``base`` has ``record_item(index)`` (a record's item, as :class:`LabelledDataset`'s); collate items with
    :func:`collate_flat`. ``records`` is ``base.records``.
    """

    def __init__(self, base: Any, batches: TokenBatches) -> None:
        self.base = base
        self.batches = batches
        self.records = base.records

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, item: int) -> list[dict[str, torch.Tensor]]:
        return [self.base.record_item(index) for index in self.batches.records(item)]

    def item_tokens(self, item: int) -> int:
        """Tokens of item ``item`` (every record's residues + 2)."""
        return self.batches.tokens(item)


def token_batched(base: Any, settings: Any, steps: int | None, parts: int) -> TokenBatchedDataset:
    """``base`` (a record dataset with ``records``) in :class:`TokenBatches` of a run's ``--global-batch-tokens``.

    ``parts`` micro-batches per step (the run's global batch in items: every data-parallel rank's micro-batches,
    :func:`bionemo.esm2.finetune.train.token_split`), the run's seed; ``steps``: the training run's optimizer
    steps (a new order each pass), or None for validation (length order, once).
    """
    lengths = [encoded_length(record.sequence) for record in base.records]
    batches = TokenBatches(lengths, settings.global_batch_tokens, parts=parts, seed=settings.seed, steps=steps)
    return TokenBatchedDataset(base, batches)
