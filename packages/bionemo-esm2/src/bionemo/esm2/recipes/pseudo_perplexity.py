"""The pseudo-perplexity's cost: how its masked copies are grouped into forward passes, and what to tell the user.

The pseudo-perplexity of a sequence of ``L`` residues takes ``L`` copies of it, each with one residue masked: ``L``
forward passes of the whole sequence, where embeddings take one. The copies of a batch's sequences are grouped into
forward passes of up to a token budget (:func:`~bionemo.esm2.model.masked_copies.copy_groups`); :func:`cost_line`
says before the loop what that costs and :class:`PseudoPerplexityTimer` estimates the time left after the first
batch.
"""

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from bionemo.esm2.model.masked_copies import copy_groups

__all__ = [
    "CPU_TOKENS_PER_FORWARD",
    "GPU_TOKENS_PER_FORWARD",
    "PseudoPerplexityCost",
    "PseudoPerplexityTimer",
    "cost_line",
    "pseudo_perplexity_cost",
    "remaining_line",
    "tokens_per_forward",
]

# The fastest budget measured on CPUs (docs/benchmarks.md#pseudo-perplexity-token-budget).
CPU_TOKENS_PER_FORWARD = 4_096
"""Token budget of one forward pass of masked copies on CPUs when ``--tokens-per-batch`` is not given: a CPU forward
is compute-bound past a few thousand tokens, and larger passes only spill out of the caches."""

# Embedding throughput on a GPU grows with the batch up to about this size and little beyond
# (docs/benchmarks.md#prediction-throughput-against-transformers).
GPU_TOKENS_PER_FORWARD = 65_536
"""Token budget of one forward pass of masked copies on GPUs when ``--tokens-per-batch`` is not given: enough tokens
to keep a GPU busy, and a forward pass of that many tokens fits beside the weights of every ESM-2 size on one GPU
(or its tensor-parallel share)."""


def tokens_per_forward(tokens_per_batch: int | None, gpu: bool) -> int:
    """The token budget of one forward pass of masked copies: ``--tokens-per-batch`` if given, else the device's.

    ``--tokens-per-batch`` already bounds what one forward pass of a batch may hold, so the copies use the same
    bound; without it the default is sized to the device (:data:`GPU_TOKENS_PER_FORWARD`,
    :data:`CPU_TOKENS_PER_FORWARD`).
    """
    if tokens_per_batch:
        return tokens_per_batch
    return GPU_TOKENS_PER_FORWARD if gpu else CPU_TOKENS_PER_FORWARD


@dataclass(frozen=True, slots=True)
class PseudoPerplexityCost:
    """What the pseudo-perplexity of a set of batches takes."""

    sequences: int
    copies: int
    """Masked copies: one per residue, each a forward pass of its whole sequence."""
    forwards: int
    """Forward passes the copies are grouped into (:func:`copy_groups`, batch by batch)."""
    budget: int
    """Tokens per forward pass of copies."""
    ratio: float
    """Tokens of the copies over the tokens of the sequences: about the cost over that of embeddings."""


def pseudo_perplexity_cost(
    batches: Sequence[Sequence[int]], budget: int, *, unpadded: bool = False
) -> PseudoPerplexityCost:
    """The cost of the pseudo-perplexity of ``batches`` (each a list of sequence lengths in tokens)."""
    lengths = [length for batch in batches for length in batch]
    tokens = sum(lengths)
    copy_tokens = sum((length - 2) * length for length in lengths)
    return PseudoPerplexityCost(
        sequences=len(lengths),
        copies=sum(length - 2 for length in lengths),
        forwards=sum(len(copy_groups(batch, budget, unpadded=unpadded)) for batch in batches),
        budget=budget,
        ratio=copy_tokens / tokens if tokens else 0.0,
    )


def cost_line(cost: PseudoPerplexityCost) -> str:
    """The line printed before the loop starts."""
    return (
        f"pseudo-perplexity: {cost.sequences:,} sequences, {cost.copies:,} masked copies (each a forward pass of "
        f"its whole sequence) in {cost.forwards:,} forward passes of up to {cost.budget:,} tokens: about "
        f"{cost.ratio:,.0f}x the cost of embeddings"
    )


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def remaining_line(first_seconds: float, first_tokens: int, later_tokens: int) -> str:
    """The line printed after the first batch: the time left at the first batch's speed (a rough estimate)."""
    left = first_seconds * later_tokens / first_tokens if first_tokens else 0.0
    return (
        f"pseudo-perplexity: the first batch took {_duration(first_seconds)}; about {_duration(left)} left "
        "(at the first batch's speed, which includes start-up costs)"
    )


class PseudoPerplexityTimer(pl.Callback):
    """After global rank 0's first prediction batch, prints the time its other batches will take at that speed.

    ``costs`` are rank 0's batches' costs in its order (any unit proportional to time, e.g. tokens of the
    copies plus tokens of the sequences). The line goes to ``write`` (default: stderr, above Rich's progress bar);
    ``clock`` is a ``perf_counter``-like function (a fake one in tests).
    """

    def __init__(
        self,
        costs: Sequence[int],
        *,
        write: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__()
        self.costs = list(costs)
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.clock = clock
        self._start: float | None = None
        self._done = False

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._done = trainer.global_rank != 0  # one line per run, from the rank that plans it

    @override
    def on_predict_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self._start is None:
            self._start = self.clock()

    @override
    def on_predict_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        if self._done or self._start is None:
            return
        self._done = True
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        if len(self.costs) > 1:
            self.write(remaining_line(self.clock() - self._start, self.costs[0], sum(self.costs[1:])))
