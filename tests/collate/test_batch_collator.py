from collections import OrderedDict, namedtuple

import pytest
import torch

from bionemo.collate import batch_collator


def test_dict_of_tensors_concatenates_along_batch():
    a = {"x": torch.tensor([[1.0, 2.0]]), "y": torch.tensor([1])}
    b = {"x": torch.tensor([[3.0, 4.0], [5.0, 6.0]]), "y": torch.tensor([2, 3])}
    out = batch_collator([a, b])
    assert isinstance(out, dict)
    torch.testing.assert_close(out["x"], torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    torch.testing.assert_close(out["y"], torch.tensor([1, 2, 3]))


@pytest.mark.parametrize("container", [list, tuple])
def test_outer_list_and_tuple_keep_their_type(container):
    batches = container([[torch.tensor([1]), torch.tensor([2])], [torch.tensor([3]), torch.tensor([4])]])
    out = batch_collator(batches)
    assert type(out) is list
    torch.testing.assert_close(out[0], torch.tensor([1, 3]))
    torch.testing.assert_close(out[1], torch.tensor([2, 4]))


def test_inner_container_types_preserved_to_any_depth():
    Pair = namedtuple("Pair", ["left", "right"])
    batch = OrderedDict(a=(torch.ones(1, 2), [torch.zeros(1), {"deep": Pair(torch.ones(1), None)}]))
    out = batch_collator([batch, batch, batch])
    assert type(out) is OrderedDict
    assert type(out["a"]) is tuple
    assert type(out["a"][1]) is list
    assert type(out["a"][1][1]["deep"]) is Pair
    assert out["a"][1][1]["deep"].right is None
    assert out["a"][0].shape == (3, 2)
    assert out["a"][1][1]["deep"].left.shape == (3,)


def test_list_of_tensors_is_one_tensor():
    out = batch_collator([torch.zeros(2, 3), torch.ones(1, 3)])
    torch.testing.assert_close(out, torch.cat([torch.zeros(2, 3), torch.ones(1, 3)]))


def test_none_batches_give_none():
    assert batch_collator([None, None]) is None
    assert batch_collator([{"a": None}, {"a": None}]) == {"a": None}


def test_token_logits_default_batch_dim_is_one():
    logits = [torch.randn(5, 2, 7), torch.randn(5, 3, 7)]
    out = batch_collator([{"token_logits": t} for t in logits])
    torch.testing.assert_close(out["token_logits"], torch.cat(logits, dim=1))


def test_custom_batch_and_seq_dims_per_key():
    scores = [torch.randn(4, 2), torch.randn(4, 1)]  # [s, b] layout, same lengths
    out = batch_collator([{"s": s} for s in scores], batch_dim_key_defaults={"s": 1}, seq_dim_key_defaults={"s": 0})
    torch.testing.assert_close(out["s"], torch.cat(scores, dim=1))
    # Explicit mappings replace the defaults: token_logits now concatenates along dim 0.
    logits = [torch.randn(2, 3), torch.randn(2, 3)]
    out = batch_collator([{"token_logits": t} for t in logits], batch_dim_key_defaults={})
    torch.testing.assert_close(out["token_logits"], torch.cat(logits, dim=0))


def test_defaults_are_not_mutated():
    import bionemo.collate.padding as padding

    before = (
        dict(padding.DEFAULT_BATCH_DIMS),
        dict(padding.DEFAULT_SEQ_DIMS),
        dict(padding.DEFAULT_PAD_VALUES),
    )
    batch_collator([{"token_logits": torch.zeros(2, 1, 3)}] * 2)
    after = (
        dict(padding.DEFAULT_BATCH_DIMS),
        dict(padding.DEFAULT_SEQ_DIMS),
        dict(padding.DEFAULT_PAD_VALUES),
    )
    assert before == after


def test_ragged_sequences_are_right_padded_with_per_key_values():
    short = {
        "labels": torch.tensor([[1, 2]]),
        "loss_mask": torch.tensor([[True, True]]),
        "token_logits": torch.ones(2, 1, 3, dtype=torch.bfloat16),
        "embeddings": torch.ones(1, 2, 4),
    }
    long = {
        "labels": torch.tensor([[3, 4, 5], [6, 7, 8]]),
        "loss_mask": torch.tensor([[True, True, False], [True, False, False]]),
        "token_logits": torch.full((3, 2, 3), 2.0, dtype=torch.bfloat16),
        "embeddings": torch.full((2, 3, 4), 2.0),
    }
    out = batch_collator([short, long])
    torch.testing.assert_close(out["labels"], torch.tensor([[1, 2, -100], [3, 4, 5], [6, 7, 8]]))
    assert out["loss_mask"].dtype == torch.bool
    assert out["loss_mask"].tolist() == [[True, True, False], [True, True, False], [True, False, False]]
    assert out["token_logits"].dtype == torch.bfloat16
    assert out["token_logits"].shape == (3, 3, 3)
    assert out["token_logits"][2, 0].eq(0).all()  # padded position of the short sample
    assert out["token_logits"][:2, 0].eq(1).all()
    assert out["token_logits"][:, 1:].eq(2).all()
    torch.testing.assert_close(out["embeddings"][0, 2], torch.zeros(4))


def test_custom_pad_values():
    out = batch_collator(
        [{"ids": torch.tensor([[1]])}, {"ids": torch.tensor([[2, 3]])}], pad_value_key_defaults={"ids": 9}
    )
    assert out["ids"].tolist() == [[1, 9], [2, 3]]
    out = batch_collator([torch.tensor([[1]]), torch.tensor([[2, 3]])], pad_value=-1)
    assert out.tolist() == [[1, -1], [2, 3]]


def test_seq_dim_none_refuses_ragged():
    with pytest.raises(ValueError, match="size 2 in dimension 1"):
        batch_collator([torch.zeros(1, 1), torch.zeros(1, 2)], seq_dim=None)


def test_result_lands_on_requested_device_not_cuda0():
    meta = batch_collator([torch.zeros(1, 2), torch.ones(1, 2)], device="meta")
    assert meta.device.type == "meta"
    assert meta.shape == (2, 2)
    # Default: the first tensor's device, with inputs from another device copied over.
    mixed = batch_collator([torch.zeros(1, 2, device="meta"), torch.ones(1, 3)])
    assert mixed.device.type == "meta"
    assert mixed.shape == (2, 3)


@pytest.mark.gpu
def test_mixed_cpu_and_gpu_tensors_follow_the_first():
    out = batch_collator([torch.zeros(1, 2, device="cuda"), torch.ones(1, 3)])
    assert out.device.type == "cuda"
    assert out.shape == (2, 3)
    out = batch_collator([torch.zeros(1, 2), torch.ones(1, 3, device="cuda")], device="cpu")
    assert out.device.type == "cpu"
    assert out.tolist() == [[0, 0, 0], [1, 1, 1]]


def test_mixed_dtypes_promote_like_torch_cat():
    out = batch_collator([torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, 2, dtype=torch.float32)])
    assert out.dtype == torch.float32
    assert out.tolist() == [[0, 0], [1, 1]]


def test_empty_sequence():
    with pytest.raises(ValueError, match="Cannot process an empty sequence"):
        batch_collator([])


@pytest.mark.parametrize(
    "outer",
    [
        {torch.zeros(1)},
        {"a": torch.zeros(1)},
        torch.zeros(2, 2),
        3,
        2.5,
        "abc",
    ],
    ids=["set", "dict", "tensor", "int", "float", "str"],
)
def test_unsupported_outer_structure(outer):
    with pytest.raises(ValueError, match="Unsupported input structure in batch_collator"):
        batch_collator(outer)


def test_unsupported_leaf_names_where():
    with pytest.raises(ValueError, match=r"Unsupported input structure in batch_collator: int at batch\['a'\]"):
        batch_collator([{"a": 1}, {"a": 2}])


def test_mismatched_keys_name_them():
    with pytest.raises(ValueError, match=r"batch 1 has different keys.*missing \['b'\], extra \['c'\]"):
        batch_collator([{"a": torch.zeros(1), "b": torch.zeros(1)}, {"a": torch.zeros(1), "c": torch.zeros(1)}])


def test_mismatched_lengths_name_the_index():
    with pytest.raises(ValueError, match=r"batch\['x'\]: batch 2 has 1 items, batch 0 has 2"):
        batch_collator([{"x": [torch.zeros(1)] * 2}, {"x": [torch.zeros(1)] * 2}, {"x": [torch.zeros(1)]}])


def test_mismatched_leaf_kinds_and_shapes():
    with pytest.raises(ValueError, match=r"batch\[1\]: batch 0 holds None but batch 1 holds Tensor"):
        batch_collator([[torch.zeros(1), None], [torch.zeros(1), torch.zeros(1)]])
    with pytest.raises(ValueError, match=r"batch\['v'\]: batch 1 has size 4 in dimension 2"):
        batch_collator([{"v": torch.zeros(1, 2, 3)}, {"v": torch.zeros(1, 2, 4)}])
    with pytest.raises(ValueError, match="batch 1 has 3 dimensions, batch 0 has 2"):
        batch_collator([torch.zeros(1, 2), torch.zeros(1, 2, 3)])
    with pytest.raises(ValueError, match="0-dimensional"):
        batch_collator([torch.tensor(1.0), torch.tensor(2.0)])
    with pytest.raises(ValueError, match="batch 0 holds a tuple but batch 1 holds list"):
        batch_collator([(torch.zeros(1),), [torch.zeros(1)]])


def test_nothing_is_mutated():
    a, b = torch.zeros(1, 2), torch.ones(1, 3)
    batches = [{"t": a}, {"t": b}]
    batch_collator(batches)
    assert batches == [{"t": a}, {"t": b}]
    assert a.shape == (1, 2)
    assert b.shape == (1, 3)
