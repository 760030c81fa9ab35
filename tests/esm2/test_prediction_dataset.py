"""PredictionDataset items: the sequence's tokens, and its masked copy only when the perplexity needs it."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bionemo.esm2.data import PredictionDataset
from bionemo.esm2.data.mlm import PredictionBatches, length_sorted_batches, spread_over_ranks
from bionemo.esm2.data.readers import SequenceRecord
from bionemo.esm2.tokenizer import ProteinTokenizer

RECORDS = [SequenceRecord(id="a", sequence="MKTAYIAKQR"), SequenceRecord(id="b", sequence="MKTAYIAKQR")]


def test_masked_copy_depends_on_the_sequence_not_the_row():
    dataset = PredictionDataset(RECORDS, ProteinTokenizer())
    first, second = dataset[0], dataset[1]
    assert torch.equal(first["masked_tokens"], second["masked_tokens"])
    assert torch.equal(first["labels"], second["labels"])
    assert (first["labels"] >= 0).any()


def test_without_the_masked_copy_items_hold_tokens_and_position_only():
    tokenizer = ProteinTokenizer()
    item = PredictionDataset(RECORDS, tokenizer, masked=False)[1]
    assert sorted(item) == ["sample_index", "tokens"]
    assert torch.equal(item["tokens"], tokenizer.encode("MKTAYIAKQR"))
    assert int(item["sample_index"]) == 1


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(3, 40), min_size=0, max_size=30),
    budget=st.integers(40, 200),
    ranks=st.integers(1, 8),
)
def test_spread_over_ranks_gives_every_rank_a_batch_within_the_limits(lengths, budget, ranks):
    batches = length_sorted_batches(lengths, tokens_per_batch=budget)
    spread = spread_over_ranks(batches, ranks)
    assert [i for batch in spread for i in batch] == [i for batch in batches for i in batch]  # each once, in order
    assert len(spread) >= ranks
    if len(lengths) >= ranks:
        assert all(spread), spread  # nobody idles
    else:
        assert len(spread) == ranks
        assert sum(1 for batch in spread if batch) == len(lengths)
    for batch in spread:
        assert len(batch) * max((lengths[i] for i in batch), default=0) <= budget
    if len(batches) >= ranks:
        assert spread == batches  # enough batches: the plan as it was


def test_an_empty_batch_collates_to_nothing_to_predict():
    from bionemo.lightning.module import _is_empty

    tokenizer = ProteinTokenizer()
    samples = PredictionDataset([SequenceRecord(id="a", sequence="MKV")], tokenizer)
    batches = PredictionBatches(samples, [[0], []], tokenizer.pad_id)
    assert batches[0]["tokens"].shape == (1, 5)
    assert _is_empty(batches[1])
