"""``run train --global-batch-tokens``: how a step's tokens are split into micro-batches, and the checks before a run.

Standard library only: bad settings are refused before torch is imported.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bionemo.recipes.registry import RecipeDefaults
from bionemo.recipes.settings import RunSettings, SettingsError

__all__ = ["TokenSteps", "split_label", "token_steps", "training_tokens"]


@dataclass(frozen=True, slots=True)
class TokenSteps:
    """Optimizer steps of up to ``budget`` tokens over ``data_parallel`` ranks, in ``per_rank`` micro-batches each.

    ``per_rank`` is the fewest that keep a micro-batch to ``micro_tokens`` on average; a step's tokens are split
    into :attr:`parts` micro-batches of about equal tokens (:class:`bionemo.esm2.data.token_batches.TokenBatches`),
    so one can exceed the average by part of a sequence.
    """

    budget: int
    micro_tokens: int
    data_parallel: int

    @property
    def per_rank(self) -> int:
        """Micro-batches per rank and step."""
        return math.ceil(self.budget / (self.data_parallel * self.micro_tokens))

    @property
    def parts(self) -> int:
        """Micro-batches per step over all ranks: the global batch in dataset items."""
        return self.data_parallel * self.per_rank

    def label(self) -> str:
        """The summary's ``batch`` row (:func:`split_label`)."""
        return split_label(self.budget, self.parts, self.data_parallel)


def split_label(budget: int, parts: int, data_parallel: int) -> str:
    """The summary's ``batch`` row of steps of up to ``budget`` tokens in ``parts`` micro-batches over the ranks."""
    return (
        f"up to {budget:,} tokens per step (similar lengths share a micro-batch): {parts // data_parallel} "
        f"micro-batch(es) of about {budget // parts:,} tokens x {data_parallel} data-parallel rank(s)"
    )


def training_tokens(settings: RunSettings, defaults: RecipeDefaults, *, gpu: bool) -> int | None:
    """Tokens per step of a training run, or None for batches by count.

    ``--global-batch-tokens`` as given; without it or ``--global-batch-size`` the recipe's
    (:meth:`~bionemo.recipes.registry.RecipeDefaults.global_batch_tokens`: on GPUs, the ESM-2 recipes' global batch
    of full-length sequences in tokens: as many sequences a step as by count when all are full-length, more when
    they are shorter, in micro-batches of the same memory); on CPUs by count.
    """
    if settings.global_batch_tokens is not None or settings.global_batch_size is not None:
        return settings.global_batch_tokens
    return defaults.for_training(gpu=gpu).global_batch_tokens()


def token_steps(settings: RunSettings, seq_length: int, lengths: dict[str, Sequence[int]]) -> TokenSteps | None:
    """The split of ``settings.global_batch_tokens`` (None: batches by count) for records of these token ``lengths``.

    Args:
        settings: Resolved training settings (:func:`bionemo.recipes.resolved.resolved_training_settings`): their
            micro-batch size times ``seq_length`` bounds a micro-batch's tokens.
        seq_length: The model's longest sequence, ``<cls>`` and ``<eos>`` included.
        lengths: Tokens of each record, by set (``training``, ``validation``).

    Raises:
        SettingsError: Micro-batches or a budget that cannot hold two of the longest sequences each (a
            micro-batch could come out empty); a set with fewer sequences than the micro-batches of a step.
    """
    budget = settings.global_batch_tokens
    if budget is None:
        return None
    micro = settings.micro_batch_size or 1
    longest = max(max(sizes) for sizes in lengths.values())
    if micro * seq_length < 2 * longest:
        raise SettingsError(
            f"micro-batches of up to {micro * seq_length:,} tokens (--micro-batch-size {micro} x {seq_length}) cannot "
            f"hold two of the longest sequences ({longest} tokens): give --micro-batch-size of at least "
            f"{math.ceil(2 * longest / seq_length)}",
            "--micro-batch-size",
        )
    steps = TokenSteps(budget, micro * seq_length, settings.data_parallel_size())
    split = f"{steps.parts} micro-batches per step ({steps.data_parallel} data-parallel rank(s) x {steps.per_rank})"
    if budget < 2 * steps.parts * longest:
        raise SettingsError(
            f"--global-batch-tokens {budget} in {split} leaves {budget // steps.parts} tokens per micro-batch, fewer "
            f"than two of the longest sequences ({longest} tokens): give at least {2 * steps.parts * longest}",
            "--global-batch-tokens",
        )
    for name, sizes in lengths.items():
        if len(sizes) < steps.parts:
            raise SettingsError(
                f"{len(sizes)} {name} sequences cannot fill the {split}: give a smaller --global-batch-tokens, more "
                "sequences, or batches by count (--global-batch-size)",
                "--global-batch-tokens",
            )
    return steps
