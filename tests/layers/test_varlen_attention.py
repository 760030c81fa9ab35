"""varlen_rotary_attention: RoPE + bidirectional attention over packed sequences in one Triton kernel (GPU prediction).

The kernel runs here under Triton's CPU interpreter against plain PyTorch: ``apply_rotary``'s formula in fp32 rounded
to the dtype, then ``scaled_dot_product_attention`` per sequence. Two things of the interpreter shape the bf16
tolerance: it multiplies bf16 ``tl.dot`` operands as raw bits, so the kernel casts them to fp32 there (on GPUs they
stay bf16: exact products, fp32 sums either way), and it truncates fp32 -> bf16 where GPUs round to nearest, so the
rotated query and key, the probabilities and the output are up to one bf16 step off instead of half of one.
"""

import json
import os
import subprocess
import sys

import pytest

LENGTHS = [3, 0, 1, 17, 40, 16, 33]
"""Packed sequence lengths: an empty one, one token, one block of 16 exactly, lengths off the blocks, several blocks."""

TILINGS = {"16x16": [16, 16, 4, 1], "32x16": [32, 16, 2, 2]}
"""``(BLOCK_M, BLOCK_N, warps, stages)``: with ``LENGTHS`` both walk full key blocks and a partial last one."""

CASES = {
    f"{dtype}-d{d}-{'rope' if rope else 'no-rope'}-{tiling}": {
        "dtype": dtype, "d": d, "rope": rope, "tiling": TILINGS[tiling], "heads": 2, "lengths": LENGTHS,
        "layout": "fused" if tiling == "16x16" else "mixed", "keys_first": tiling == "32x16",
    }
    for dtype in ("float32", "bfloat16") for d in (32, 64) for rope in (True, False) for tiling in TILINGS
} | {
    f"float32-d{d}-rope-default-tiling": {
        "dtype": "float32", "d": d, "rope": True, "tiling": None, "heads": 3, "lengths": LENGTHS, "layout": "fused",
        "keys_first": True,
    }
    for d in (16, 24)  # halves of 8 and 12 columns, padded to 16 for tl.dot
}  # fmt: skip
"""Layouts: ``fused``, query, key and value are strided views of one ``[T, heads, 3, d]`` buffer (megatron's fused
QKV projection); ``mixed``, each strided differently: the query a view of a ``[T, 3, heads, d]`` buffer, the key of a
head-major ``[heads, T, d]`` one, the value contiguous. ``keys_first``: the kernel's ``KEYS_ROTATED_FIRST`` (keys
rotated by ``rotate_strided`` before the kernel, or in its inner loop)."""

# In a process started with TRITON_INTERPRET=1 (Triton's own jit helpers, tl.max's and tl.sum's, are interpreted only
# when it is set before triton is imported): each case's largest error relative to 1 + |reference|.
CHILD = """
import json, sys
import torch
import torch.nn.functional as F
from bionemo.layers import _varlen_attention_triton
from bionemo.layers._varlen_attention_triton import varlen_rotary_attention

def rope(x, cos, sin):
    x1, x2 = x.float().chunk(2, dim=-1)  # apply_rotary's formula in fp32, rounded to the dtype as its kernel stores it
    rotated = x.float() * cos.float()[:, None] + torch.cat((-x2, x1), dim=-1) * sin.float()[:, None]
    return rotated.to(x.dtype)

def reference(query, key, value, bounds, scale):
    out = torch.zeros(query.shape[0], query.shape[1] * query.shape[2])
    for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if end > start:
            q, k, v = (t[start:end].float().transpose(0, 1) for t in (query, key, value))
            out[start:end] = F.scaled_dot_product_attention(q, k, v, scale=scale).transpose(0, 1).flatten(1)
    return out

errors = {}
for name, case in json.loads(sys.argv[1]).items():
    torch.manual_seed(0)
    dtype, d, heads, lengths = getattr(torch, case["dtype"]), case["d"], case["heads"], case["lengths"]
    tokens = sum(lengths)
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    fused = torch.randn(tokens, heads, 3, d)
    fused[:, :, 0] *= 2  # larger scores: attention further from uniform, so that wrong masks show more
    query, key, value = fused.to(dtype).unbind(2)
    if case["layout"] == "mixed":
        query = (torch.randn(tokens, 3, heads, d) * 2).to(dtype)[:, 1]
        key, value = key.transpose(0, 1).contiguous().transpose(0, 1), value.contiguous()
    assert not query.is_contiguous()
    angles = torch.rand(tokens, d) * 6.3  # any table: both halves differ, unlike ESM-2's
    cos, sin = (angles.cos().to(dtype), angles.sin().to(dtype)) if case["rope"] else (None, None)
    scale = 0.7 / d**0.5
    tiling = None if case["tiling"] is None else tuple(case["tiling"])
    _varlen_attention_triton.KEYS_ROTATED_FIRST = case["keys_first"]
    out = varlen_rotary_attention(query, key, value, bounds, max(lengths), scale, cos, sin, tiling)
    assert out.shape == (tokens, heads * d) and out.dtype == dtype and out.is_contiguous(), (name, out.shape)
    if case["rope"]:
        query, key = rope(query, cos, sin), rope(key, cos, sin)
    expected = reference(query, key, value, bounds, scale)
    errors[name] = float(((out.float() - expected).abs() / (1 + expected.abs())).max())
print(json.dumps(errors))
"""


@pytest.fixture(scope="module")
def errors() -> dict[str, float]:
    """Every case's error, from one interpreter process (its start-up, importing torch and megatron, dominates)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-c", CHILD, json.dumps(CASES)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_equals_rope_then_attention_per_sequence(errors, case):
    """fp32: the products and sums of the reference up to ordering; bf16: see the module docstring."""
    assert errors[case] < (1e-5 if CASES[case]["dtype"] == "float32" else 2e-2), errors[case]


def test_invalid_arguments_name_what_was_given():
    pytest.importorskip("triton")
    import torch

    from bionemo.layers._varlen_attention_triton import varlen_rotary_attention

    q = torch.zeros(4, 2, 8)
    bounds = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"\[T, heads, d\]"):
        varlen_rotary_attention(q, q[:3], q, bounds, 4)
    with pytest.raises(ValueError, match="int32"):
        varlen_rotary_attention(q, q, q, bounds.long(), 4)
    with pytest.raises(ValueError, match="together"):
        varlen_rotary_attention(q, q, q, bounds, 4, cos=torch.zeros(4, 8))
    with pytest.raises(ValueError, match="even"):
        varlen_rotary_attention(torch.zeros(4, 2, 7), torch.zeros(4, 2, 7), torch.zeros(4, 2, 7), bounds, 4)


# The residual-GEMM block of three layers (tests/layers/test_residual_gemm.py's, fp32 on CPU) with its attention
# layers' fused path taken (the CUDA condition stood in for), against the same block with it switched off.
BLOCK_CHILD = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import torch
import bionemo.layers.residual_gemm as residual_gemm
import bionemo.layers.sdpa_attention as sdpa
from test_residual_gemm import _block, _inputs

sdpa.fused_rotary_attention_available = lambda query: os.environ.get(sdpa.FUSED_ROTARY_SWITCH) != "0"
calls = []
attend = sdpa.SDPACoreAttention.attend_rotated
sdpa.SDPACoreAttention.attend_rotated = lambda *args: calls.append(1) or attend(*args)
block, inputs = _block(), _inputs(unpadded=True)
if sys.argv[2] == "lora-qkv":  # the projection's output is the base GEMM's plus the adapter's product
    from bionemo.layers import LoRAConfig, apply_lora
    assert apply_lora(block, LoRAConfig(rank=2, targets=frozenset({"self_attention.linear_qkv"})))
    with torch.no_grad():
        for name, p in block.named_parameters():
            if "lora" in name:
                p.normal_(0.0, 0.3)  # adapters start as zero products: made to count
args = [inputs[key] for key in ("hidden_states", "attention_mask", "rotary_pos_emb", "packed_seq_params")]
with torch.no_grad():
    fused = residual_gemm.forward_residual_in_gemm(block, *args)
    os.environ[sdpa.FUSED_ROTARY_SWITCH] = "0"
    reference = residual_gemm.forward_residual_in_gemm(block, *args)
error, scale = float((fused - reference).abs().max()), float(reference.abs().max())
print(json.dumps({"calls": len(calls), "error": error, "scale": scale}))
"""


@pytest.mark.parametrize("adapters", ["plain", "lora-qkv"])
def test_attention_layers_take_the_kernel_for_unpadded_sequences_with_the_same_output(adapters):
    """``RotarySelfAttention.attend`` hands RoPE and attention to the kernel where the core attention says so; also
    with a LoRA adapter on the QKV projection (fine-tuned models' prediction)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    here = os.path.dirname(os.path.abspath(__file__))
    command = [sys.executable, "-c", BLOCK_CHILD, here, adapters]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["calls"] == 3  # one per layer
    assert outcome["scale"] > 1
    assert outcome["error"] < 1e-4, outcome


def test_keys_are_rotated_first_for_longer_sequences_unless_set(monkeypatch):
    pytest.importorskip("triton")
    from bionemo.layers import _varlen_attention_triton as kernel

    limit = kernel.KEYS_FIRST_LONGER_THAN
    assert not kernel.keys_rotated_first(limit)
    assert kernel.keys_rotated_first(limit + 1)
    assert kernel.default_tiling(32, limit)[3] == 1  # keys rotated in the loop at d 32: one stage
    assert kernel.default_tiling(32, limit + 1)[3] == 3
    for setting in (True, False):
        monkeypatch.setattr(kernel, "KEYS_ROTATED_FIRST", setting)
        assert kernel.keys_rotated_first(1) is setting
        assert kernel.keys_rotated_first(1000) is setting
