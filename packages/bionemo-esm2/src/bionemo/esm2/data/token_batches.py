"""Batches cut by tokens: which records each optimizer step holds, and each micro-batch's share of them.

Pretraining (:class:`bionemo.esm2.data.mlm.MaskedTokenBatches`) and fine-tuning
(:class:`bionemo.esm2.finetune.data.TokenBatchedDataset`) serve :class:`TokenBatches`' micro-batches as dataset
items, one item per micro-batch (``micro_batch_size`` 1), collated with :func:`collate_flat`.
"""

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["GROUPS_PER_BUCKET", "TokenBatches", "collate_flat", "split_evenly"]


GROUPS_PER_BUCKET = 50
"""Batches per bucket of a pass's length grouping (as Hugging Face's ``group_by_length``): a bucket of records is
sorted by length before it is cut into batches, so a batch pads little and the batches of a pass stay a random draw."""


def collate_flat(collate: Any, items: list[list[Any]]) -> Any:
    """``collate`` of the records of every item (each a micro-batch of :class:`TokenBatches`: a list of records)."""
    return collate([record for item in items for record in item])


class TokenBatches:
    """Which records each global batch holds when batches are cut by tokens, and each data-parallel rank's share.

    A global batch (one optimizer step) holds at most ``budget`` tokens (residues + 2 per sequence, no padding)
    over all ranks, and is split into ``parts`` micro-batches of about equal tokens (data-parallel ranks); item
    ``step * parts + part`` is that part. What a global batch holds depends on ``lengths``, ``budget`` and ``seed``
    only, so every layout trains on the same batches; only their split follows ``parts``.

    With ``steps`` (training) pass ``e`` draws an order of the records from ``seed`` and ``e``, sorts buckets of
    :data:`GROUPS_PER_BUCKET` budgets' worth of records by length, cuts the result into batches greedily and
    shuffles the batches: each pass sees each record once, similar lengths share a batch, batches come in random
    order. Without ``steps`` (validation) the records are cut in length order, once. A pass's last batch smaller
    than half the budget joins the one before it, so every batch but a lone one holds more than half the budget.

    A pass is cut with numpy when first needed (~0.4 s and 8 bytes a record for a million records).

    Raises:
        ValueError: A budget below two of the longest sequences per part (a part could come out empty), or fewer
            records than parts.
    """

    def __init__(self, lengths: Sequence[int], budget: int, *, parts: int = 1, seed: int = 0, steps: int | None = None):
        if parts < 1:
            raise ValueError(f"parts must be at least 1, got {parts}")
        if len(lengths) < parts:
            raise ValueError(f"{len(lengths)} records cannot fill {parts} parts of a batch")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        longest = int(self.lengths.max())
        if budget < 2 * parts * longest:
            raise ValueError(
                f"a budget of {budget} tokens must hold two of the longest sequences ({longest} tokens) per part "
                f"({parts} parts): at least {2 * parts * longest}"
            )
        self.budget = budget
        self.parts = parts
        self.seed = seed
        self.shuffled = steps is not None
        self._passes: list[list[np.ndarray]] = []
        self._pass_starts: list[int] = []  # the first step of each pass cut so far
        self._split: tuple[int, list[list[int]]] | None = None  # the last step split into parts
        self.steps = len(self._pass(0)) if steps is None else steps

    def __len__(self) -> int:
        return self.steps * self.parts

    def batches_of_pass(self, epoch: int) -> list[list[int]]:
        """The global batches (record indices) of pass ``epoch``, in training order."""
        return [batch.tolist() for batch in self._pass(epoch)]

    def global_batch(self, step: int) -> list[int]:
        """The records of optimizer step ``step`` (passes follow one another)."""
        epoch = self.pass_of(step)
        return self._passes[epoch][step - self._pass_starts[epoch]].tolist()

    def pass_of(self, step: int) -> int:
        """Which pass over the records optimizer step ``step`` belongs to."""
        while not self._passes or step >= self._pass_starts[-1] + len(self._passes[-1]):
            self._pass(len(self._passes))
        return bisect.bisect_right(self._pass_starts, step) - 1

    def records(self, item: int) -> list[int]:
        """The records of item ``item``: part ``item % parts`` of step ``item // parts``."""
        step, part = divmod(item, self.parts)
        if self._split is None or self._split[0] != step:  # the parts of one step are asked for in turn
            members = self.global_batch(step)
            sizes = dict(zip(members, self.lengths[members].tolist(), strict=True))
            self._split = (step, split_evenly(members, sizes, self.parts))
        return self._split[1][part]

    def tokens(self, item: int) -> int:
        """Tokens of item ``item``."""
        return int(self.lengths[self.records(item)].sum())

    def _pass(self, epoch: int) -> list[np.ndarray]:
        """The global batches of pass ``epoch`` (views into one array of record indices), cut on first use."""
        while len(self._passes) <= epoch:
            start = self._pass_starts[-1] + len(self._passes[-1]) if self._passes else 0
            self._passes.append(self._cut(len(self._passes)))
            self._pass_starts.append(start)
        return self._passes[epoch]

    def _cut(self, epoch: int) -> list[np.ndarray]:
        n = len(self.lengths)
        if not self.shuffled:
            if epoch:
                raise IndexError("validation batches make one pass")
            return self._greedy(np.lexsort((np.arange(n), self.lengths)))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(n, generator=generator).numpy()
        # buckets of the drawn order: each closes with the record that brings it to GROUPS_PER_BUCKET budgets
        ends = _runs(np.cumsum(self.lengths[order]), GROUPS_PER_BUCKET * self.budget, closing=True)
        bucket = np.repeat(np.arange(len(ends)), np.diff(ends, prepend=0))
        ranked = order[np.lexsort((order, self.lengths[order], bucket))]  # by bucket, then length, then index
        batches = self._greedy(ranked)
        shuffled = torch.randperm(len(batches), generator=generator).tolist()
        return [batches[b] for b in shuffled]

    def _greedy(self, ranked: np.ndarray) -> list[np.ndarray]:
        """``ranked`` cut in turn into batches of at most ``budget`` tokens; a small last one joins the one before."""
        filled = np.cumsum(self.lengths[ranked])
        ends = _runs(filled, self.budget, closing=False)
        if len(ends) > 1 and 2 * (filled[-1] - filled[ends[-2] - 1]) < self.budget:
            ends.pop(-2)
        return np.split(ranked, ends[:-1])


def _runs(cumulative: np.ndarray, limit: int, *, closing: bool) -> list[int]:
    """Where consecutive runs of a sequence end (exclusive), given its running sum ``cumulative``.

    ``closing``: a run ends with the first element that brings it to ``limit`` or more (the rest is the last run);
    else a run takes elements while it stays within ``limit``, and at least one.
    """
    ends: list[int] = []
    n, start, base = len(cumulative), 0, 0
    while start < n:
        if closing:
            end = int(np.searchsorted(cumulative, base + limit, side="left")) + 1
        else:
            end = max(int(np.searchsorted(cumulative, base + limit, side="right")), start + 1)
        end = min(end, n)
        ends.append(end)
        start, base = end, int(cumulative[end - 1])
    return ends


def split_evenly(members: Sequence[int], lengths: Sequence[int] | Mapping[int, int], parts: int) -> list[list[int]]:
    """``members`` (record indices) in length order cut into ``parts`` runs of about equal tokens, none empty.

    ``lengths[i]`` is record ``i``'s length. Consecutive lengths keep each part's padding small; part ``j`` ends
    where the running token count first reaches ``(j + 1) / parts`` of the total.
    """
    ranked = sorted(members, key=lambda i: (lengths[i], i))
    if len(ranked) < parts:
        raise ValueError(f"{len(ranked)} records cannot fill {parts} parts")
    total = sum(lengths[i] for i in ranked)
    ends: list[int] = []
    running = 0
    for position, i in enumerate(ranked):
        running += lengths[i]
        while len(ends) < parts - 1 and running * parts >= (len(ends) + 1) * total:
            ends.append(position + 1)
    ends.append(len(ranked))
    for j in range(parts):  # at least one record per part, in order
        low = (ends[j - 1] if j else 0) + 1
        high = len(ranked) - (parts - 1 - j)
        ends[j] = min(max(ends[j], low), high)
    starts = [0, *ends[:-1]]
    return [ranked[a:b] for a, b in zip(starts, ends, strict=True)]
