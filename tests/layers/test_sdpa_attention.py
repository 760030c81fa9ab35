"""SDPACoreAttention against attention written out in plain PyTorch."""

import math

import pytest
import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from bionemo.layers import SDPACoreAttention


def reference(q, k, v, allowed, bias=None):
    """softmax(q k^T / sqrt(d) + bias) v where ``allowed`` (True = may attend); q, k, v [s, b, h, d].

    ``allowed`` and ``bias`` broadcast to ``[b, h, s, s]``.
    """
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, h, s, d]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # [b, h, s, d]
    s, b, h, d = out.shape[2], out.shape[0], out.shape[1], out.shape[3]
    return out.permute(2, 0, 1, 3).reshape(s, b, h * d)


def make(mask_type):
    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4, use_cpu_initialization=True)
    return SDPACoreAttention(config, layer_number=1, attn_mask_type=mask_type, attention_type="self").eval()


@pytest.fixture
def qkv():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(6, 2, 4, 4, generator=gen) for _ in range(3)]


def test_padding_mask_matches_reference(qkv):
    lengths = torch.tensor([6, 4])
    valid = torch.arange(6)[None, :] < lengths[:, None]  # [b, s]
    megatron_mask = ~valid[:, None, None, :]  # True = masked out, [b, 1, 1, s]
    out = make(AttnMaskType.padding)(*qkv, megatron_mask)
    allowed = valid[:, None, None, :].expand(2, 1, 6, 6)
    torch.testing.assert_close(out, reference(*qkv, allowed))


def test_causal_matches_reference(qkv):
    out = make(AttnMaskType.causal)(*qkv, None)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()[None, None].expand(2, 1, 6, 6)
    torch.testing.assert_close(out, reference(*qkv, allowed))


CAUSAL = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]  # [1, 1, s, s]
LENGTHS = torch.tensor([6, 4])
VALID = torch.arange(6)[None, :] < LENGTHS[:, None]  # [b, s]
PADDING_MASK = ~VALID[:, None, None, :]  # megatron's: True = masked out, [b, 1, 1, s]


@pytest.mark.parametrize("mask_type", [AttnMaskType.causal, AttnMaskType.padding_causal])
def test_padding_and_causal_masks_combine(qkv, mask_type):
    out = make(mask_type)(*qkv, PADDING_MASK)
    allowed = CAUSAL & VALID[:, None, None, :]
    torch.testing.assert_close(out, reference(*qkv, allowed))


def bias(shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("bias_shape", [(2, 4, 6, 6), (1, 4, 6, 6)])
def test_attention_bias_keeps_causality(qkv, bias_shape):
    attention_bias = bias(bias_shape)
    out = make(AttnMaskType.causal)(*qkv, None, attention_bias=attention_bias)
    torch.testing.assert_close(out, reference(*qkv, CAUSAL, attention_bias))


@pytest.mark.parametrize("mask_type", [AttnMaskType.causal, AttnMaskType.padding])
def test_attention_bias_with_a_padding_mask(qkv, mask_type):
    attention_bias = bias((1, 4, 6, 6))  # broadcast over the batch, the mask over heads and queries
    out = make(mask_type)(*qkv, PADDING_MASK, attention_bias=attention_bias)
    allowed = VALID[:, None, None, :] & (CAUSAL if mask_type == AttnMaskType.causal else True)
    torch.testing.assert_close(out, reference(*qkv, allowed, attention_bias))


def test_unsupported_inputs_are_refused(qkv):
    with pytest.raises(ValueError, match="packed sequences"):
        make(AttnMaskType.padding)(*qkv, None, packed_seq_params=object())
    config = TransformerConfig(
        num_layers=1, hidden_size=16, num_attention_heads=4, context_parallel_size=2, use_cpu_initialization=True
    )
    with pytest.raises(ValueError, match="context_parallel_size=2 for bidirectional attention only"):
        SDPACoreAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")


def test_cuda_attention_dropout_draws_from_megatrons_model_parallel_rng_stream(monkeypatch):
    """Tensor-parallel ranks hold different heads: their dropout masks must come from per-rank RNG states."""
    import contextlib

    from megatron.core import tensor_parallel
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from bionemo.layers import sdpa_attention

    forks: list[bool] = []

    class Tracker:
        @contextlib.contextmanager
        def fork(self):
            forks.append(True)
            yield

    monkeypatch.setattr(tensor_parallel, "get_cuda_rng_tracker", lambda *args, **kwargs: Tracker())
    monkeypatch.setattr(sdpa_attention, "_on_cuda", lambda tensor: True)  # as a GPU run would see it
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, attention_dropout=0.5)
    attention = sdpa_attention.SDPACoreAttention(config, 1, AttnMaskType.padding, "self")
    q = torch.randn(5, 2, 2, 4)
    attention.train()
    attention(q, q, q, None)
    assert forks == [True]
    attention.eval()  # no dropout: the default stream, no fork
    attention(q, q, q, None)
    assert forks == [True]


def test_bottom_right_causality_with_fewer_queries_than_keys(qkv):
    """``causal_bottom_right``: the last query sees every key, each earlier one a key fewer."""
    q, k, v = qkv
    out = make(AttnMaskType.causal_bottom_right)(q[3:], k, v, None)
    allowed = torch.ones(3, 6, dtype=torch.bool).tril(diagonal=3)[None, None]
    torch.testing.assert_close(out, reference(q[3:], k, v, allowed))


def test_attends_rotated_only_where_the_fused_kernel_computes_the_same(monkeypatch):
    """The fused RoPE + attention kernel serves unpadded bidirectional prediction only; the device check stood in."""
    import bionemo.layers.sdpa_attention as sdpa
    from bionemo.layers import UnpaddedSequences

    available = {"yes": True}
    monkeypatch.setattr(sdpa, "fused_rotary_attention_available", lambda query: available["yes"])
    attention = make(AttnMaskType.padding)
    query = torch.zeros(5, 4, 4)
    packed = UnpaddedSequences(boundaries=torch.tensor([0, 2, 5], dtype=torch.int32), longest=3)
    with torch.no_grad():
        assert attention.attends_rotated(query, query, packed)
        assert not attention.attends_rotated(query, query[:, :2], packed)  # grouped-query keys
        assert not attention.attends_rotated(query, query, None)  # padded batches
        assert not attention.attends_rotated(query, query, UnpaddedSequences(longest=3))  # no boundaries
        assert not make(AttnMaskType.causal).attends_rotated(query, query, packed)
        available["yes"] = False  # CPU, fp32, no Triton or BIONEMO_FUSED_ROTARY_ATTENTION=0
        assert not attention.attends_rotated(query, query, packed)
    available["yes"] = True
    assert not attention.attends_rotated(query, query, packed)  # a gradient to record: the kernel has no backward
    with torch.no_grad():
        attention.train()
        attention.dropout_p = 0.1
        assert not attention.attends_rotated(query, query, packed)


def test_fused_rotary_attention_needs_cuda_half_precision_and_the_switch(monkeypatch):
    from bionemo.layers.sdpa_attention import FUSED_ROTARY_SWITCH, fused_rotary_attention_available

    assert not fused_rotary_attention_available(torch.zeros(2, 1, 8, dtype=torch.bfloat16))  # on the CPU
    monkeypatch.setenv(FUSED_ROTARY_SWITCH, "0")
    assert not fused_rotary_attention_available(torch.zeros(2, 1, 8))
