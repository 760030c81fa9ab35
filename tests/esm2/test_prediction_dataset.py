"""PredictionDataset items: the sequence's tokens, and its masked copy only when the perplexity needs it."""

import torch

from bionemo.esm2.data import PredictionDataset
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
