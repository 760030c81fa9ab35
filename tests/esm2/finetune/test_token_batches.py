"""Fine-tuning batches cut by tokens: what each step holds, and each data-parallel rank's share of it.

Checked against the definitions in ``bionemo.esm2.finetune.data.TokenBatches``: every pass trains on each record
once, a global batch keeps to its budget (a pass's merged last batch: to one and a half), the global batches do not
depend on how many ranks split them, and the split gives every rank a non-empty, near-equal share.
"""

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bionemo.esm2.finetune.data import (
    LabelledDataset,
    TokenBatchedDataset,
    TokenBatches,
    collate_flat,
    collate_labelled,
    split_evenly,
)
from bionemo.esm2.finetune.tasks import LabelledRecord, LabelVocabulary, Task

lengths_strategy = st.lists(st.integers(min_value=3, max_value=60), min_size=8, max_size=120)


def _budget(lengths: list[int], parts: int, scale: int) -> int:
    return 2 * parts * max(lengths) * scale


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_strategy, parts=st.integers(1, 4), scale=st.integers(1, 4), seed=st.integers(0, 5))
def test_each_pass_trains_on_every_record_once_within_the_budget(lengths, parts, scale, seed):
    if len(lengths) < parts:
        return
    budget = _budget(lengths, parts, scale)
    batches = TokenBatches(lengths, budget, parts=parts, seed=seed, steps=1)
    for epoch in range(3):
        cut = batches.batches_of_pass(epoch)
        assert sorted(i for batch in cut for i in batch) == list(range(len(lengths)))
        tokens = [sum(lengths[i] for i in batch) for batch in cut]
        assert all(t <= 1.5 * budget for t in tokens)
        assert sum(t > budget for t in tokens) <= 1  # only a merged last batch goes over
        if len(cut) > 1:
            assert all(2 * t >= budget for t in tokens)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_strategy, scale=st.integers(1, 3), seed=st.integers(0, 5))
def test_the_global_batches_are_the_same_however_many_ranks_split_them(lengths, scale, seed):
    budget = _budget(lengths, 4, scale)
    split = {parts: TokenBatches(lengths, budget, parts=parts, seed=seed, steps=12) for parts in (1, 2, 4)}
    for step in range(12):
        expected = sorted(split[1].records(step))
        for parts, batches in split.items():
            shares = [batches.records(step * parts + part) for part in range(parts)]
            assert all(shares), (parts, step)
            assert sorted(i for share in shares for i in share) == expected


@settings(max_examples=100, deadline=None)
@given(lengths=lengths_strategy, parts=st.integers(1, 6))
def test_split_evenly_gives_each_part_its_share_give_or_take_a_sequence(lengths, parts):
    members = list(range(len(lengths)))
    if len(members) < parts:
        with pytest.raises(ValueError, match="cannot fill"):
            split_evenly(members, lengths, parts)
        return
    shares = split_evenly(members, lengths, parts)
    assert len(shares) == parts
    assert all(shares)
    assert sorted(i for share in shares for i in share) == members
    total = sum(lengths)
    for share in shares:
        assert sum(lengths[i] for i in share) <= total / parts + 2 * max(lengths)


def test_passes_come_in_a_new_order_and_the_same_on_a_rebuild():
    lengths = [(7 * i) % 50 + 5 for i in range(200)]
    first = TokenBatches(lengths, 400, seed=1, steps=30)
    again = TokenBatches(lengths, 400, seed=1, steps=30)
    assert [first.records(k) for k in range(30)] == [again.records(k) for k in range(30)]
    assert first.batches_of_pass(0) != first.batches_of_pass(1)
    other_seed = TokenBatches(lengths, 400, seed=2, steps=30)
    assert first.batches_of_pass(0) != other_seed.batches_of_pass(0)


def test_batches_group_similar_lengths():
    """Length grouping: a batch's lengths spread far less than a random draw of the same size would."""
    generator = torch.Generator().manual_seed(0)
    lengths = (torch.randint(5, 500, (2000,), generator=generator)).tolist()
    batches = TokenBatches(lengths, 4000, seed=0, steps=1).batches_of_pass(0)
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)
    assert spread < 100  # a random draw of ~16 lengths out of 5..500 spreads over ~440


def test_validation_batches_cover_the_records_once_in_length_order():
    lengths = [30, 5, 12, 40, 8, 22, 17, 9]
    batches = TokenBatches(lengths, 160, parts=2)
    assert len(batches) == batches.steps * 2
    cut = batches.batches_of_pass(0)
    assert [i for batch in cut for i in batch] == sorted(range(8), key=lambda i: lengths[i])


def test_a_budget_below_two_of_the_longest_per_part_is_refused():
    with pytest.raises(ValueError, match="at least 160"):
        TokenBatches([10, 40, 20, 30], 159, parts=2)
    with pytest.raises(ValueError, match="cannot fill 4 parts"):
        TokenBatches([10, 20, 30], 1000, parts=4)


def test_items_collate_into_one_padded_micro_batch_per_rank():
    records = [LabelledRecord(id=f"r{i}", sequence="ACDEFGHIKL"[: 3 + i], labels=("ab"[i % 2],)) for i in range(8)]
    vocabulary = LabelVocabulary.from_records(Task.CLASSIFICATION, ["kind"], records, Path("train.csv"))
    base = LabelledDataset(records, vocabulary)
    lengths = [len(r.sequence) + 2 for r in records]
    dataset = TokenBatchedDataset(base, TokenBatches(lengths, 2 * 2 * max(lengths), parts=2, steps=4))
    assert len(dataset) == 8
    batch = collate_flat(lambda items: collate_labelled(items, pad_id=1), [dataset[0]])
    indices = dataset.batches.records(0)
    assert batch["sample_index"].tolist() == indices
    assert batch["host_lengths"] == [lengths[i] for i in indices]
    assert dataset.item_tokens(0) == sum(batch["host_lengths"])
