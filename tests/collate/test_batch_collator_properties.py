"""Property: batch_collator equals "pad each leaf to the longest, then torch.cat" on random structures."""

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from bionemo.collate import batch_collator

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool]
KEYS = ["token_logits", "labels", "loss_mask", "embeddings", "hidden", "x"]
KEY_BATCH_DIM = {"token_logits": 1}
KEY_SEQ_DIM = {"token_logits": 0}
KEY_PAD = {"labels": -100, "loss_mask": 0, "attention_mask": 0, "token_logits": 0}


@dataclass(frozen=True)
class Leaf:
    """One tensor position in the structure and how every batch fills it."""

    ndim: int
    dtype: torch.dtype
    batch_dim: int
    seq_dim: int
    pad: float
    fixed: tuple[int, ...]  # sizes of the dims that are neither batch nor sequence


def leaves(batch_dim: int, seq_dim: int, pad: float) -> st.SearchStrategy:
    def build(ndim, dtype, fixed):
        pad_value = pad if dtype is not torch.bool else bool(pad)
        return st.just(Leaf(ndim, dtype, batch_dim, seq_dim, pad_value, tuple(fixed)))

    return (
        st.integers(max(batch_dim, seq_dim) + 1, 4)
        .flatmap(
            lambda ndim: st.tuples(
                st.just(ndim), st.sampled_from(DTYPES), st.lists(st.integers(1, 3), min_size=4, max_size=4)
            )
        )
        .flatmap(lambda args: build(*args))
    )


def schemas(depth: int = 3, batch_dim: int = 0, seq_dim: int = 1, pad: float = 0) -> st.SearchStrategy:
    leaf = leaves(batch_dim, seq_dim, pad)
    if depth == 0:
        return leaf
    children = [leaf, st.just(None)]

    def keyed(keys):
        return st.fixed_dictionaries(
            {
                k: schemas(
                    depth - 1,
                    KEY_BATCH_DIM.get(k, batch_dim),
                    KEY_SEQ_DIM.get(k, seq_dim),
                    KEY_PAD.get(k, pad),
                )
                for k in keys
            }
        )

    sub = schemas(depth - 1, batch_dim, seq_dim, pad)
    return st.one_of(
        *children,
        st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True).flatmap(keyed),
        st.lists(sub, min_size=1, max_size=3),
        st.lists(sub, min_size=1, max_size=3).map(tuple),
    )


def make_tensor(leaf: Leaf, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    shape = list(leaf.fixed[: leaf.ndim])
    shape[leaf.batch_dim] = batch
    shape[leaf.seq_dim] = seq
    values = torch.randint(-50, 50, shape, generator=gen)
    return values.to(leaf.dtype)


def fill(schema, sizes, gen):
    """One batch following ``schema``; ``sizes`` is (batch size, seq length) for every leaf of this batch."""
    if schema is None:
        return None
    if isinstance(schema, Leaf):
        batch, seq = sizes
        return make_tensor(schema, batch, seq, gen)
    if isinstance(schema, dict):
        return {k: fill(v, sizes, gen) for k, v in schema.items()}
    container: Any = type(schema)
    return container(fill(v, sizes, gen) for v in schema)


def reference(schema, batches):
    """Pad every leaf tensor to the longest sequence with F.pad, then torch.cat along the batch dim."""
    if schema is None:
        return None
    if isinstance(schema, Leaf):
        longest = max(t.shape[schema.seq_dim] for t in batches)
        padded = []
        for t in batches:
            # F.pad takes (left, right) pairs starting from the last dimension.
            widths = [0, 0] * (t.dim() - 1 - schema.seq_dim) + [0, longest - t.shape[schema.seq_dim]]
            source = t.to(torch.float64) if t.dtype in (torch.bool, torch.bfloat16, torch.float16) else t
            padded.append(F.pad(source, widths, value=float(schema.pad)).to(t.dtype))
        return torch.cat(padded, dim=schema.batch_dim)
    if isinstance(schema, dict):
        return {k: reference(v, [b[k] for b in batches]) for k, v in schema.items()}
    container: Any = type(schema)
    return container(reference(v, [b[i] for b in batches]) for i, v in enumerate(schema))


def assert_same(actual, expected):
    if expected is None:
        assert actual is None
    elif isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor)
        assert actual.dtype == expected.dtype
        assert torch.equal(actual, expected)
    else:
        assert type(actual) is type(expected)
        if isinstance(expected, dict):
            assert actual.keys() == expected.keys()
            for k in expected:
                assert_same(actual[k], expected[k])
        else:
            assert len(actual) == len(expected)
            for a, e in zip(actual, expected, strict=True):
                assert_same(a, e)


@given(
    schema=schemas(),
    sizes=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 5)), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_matches_pad_then_cat_reference(schema, sizes, seed):
    gen = torch.Generator().manual_seed(seed)
    batches = [fill(schema, s, gen) for s in sizes]
    assert_same(batch_collator(batches), reference(schema, batches))
