"""`TokenBatches` cuts passes with numpy; a plain-Python reading of its definition must give the same batches.

The reference: draw an order of the records (torch's randperm from the seed and the pass), close a bucket with the
record that brings it to GROUPS_PER_BUCKET budgets, sort each bucket by (length, index), cut greedily into batches
that stay within the budget (at least one record), let a last batch under half the budget join the one before,
and shuffle the batches with the same generator. Validation: length order, cut the same way, once.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bionemo.esm2.data import token_batches
from bionemo.esm2.data.token_batches import TokenBatches


def _greedy(ranked: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    batches: list[list[int]] = [[]]
    filled = 0
    for i in ranked:
        if batches[-1] and filled + lengths[i] > budget:
            batches.append([])
            filled = 0
        batches[-1].append(i)
        filled += lengths[i]
    if len(batches) > 1 and 2 * filled < budget:
        last = batches.pop()
        batches[-1] += last
    return batches


def _reference_pass(lengths: list[int], budget: int, seed: int, epoch: int, groups: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    ranked: list[int] = []
    bucket: list[int] = []
    filled = 0
    for i in order:
        bucket.append(i)
        filled += lengths[i]
        if filled >= groups * budget:
            ranked += sorted(bucket, key=lambda k: (lengths[k], k))
            bucket, filled = [], 0
    ranked += sorted(bucket, key=lambda k: (lengths[k], k))
    batches = _greedy(ranked, lengths, budget)
    shuffled = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[b] for b in shuffled]


@given(
    lengths=st.lists(st.integers(3, 200), min_size=4, max_size=300),
    slack=st.integers(0, 4000),
    seed=st.integers(0, 10_000),
    groups=st.sampled_from([1, 2, 50]),
)
@settings(max_examples=150, deadline=None)
def test_passes_are_those_of_the_plain_python_definition(lengths, slack, seed, groups):
    budget = 2 * max(lengths) + slack
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(token_batches, "GROUPS_PER_BUCKET", groups)  # small buckets close often
        training = TokenBatches(lengths, budget, seed=seed, steps=5)
        for epoch in range(2):
            assert training.batches_of_pass(epoch) == _reference_pass(lengths, budget, seed, epoch, groups)
    validation = TokenBatches(lengths, budget)
    ranked = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    assert validation.batches_of_pass(0) == _greedy(ranked, lengths, budget)
