"""Cases of tests/layers/test_varlen_attention_triton.py, run in a process started with ``TRITON_INTERPRET=1``.

Triton's own jit helpers (``tl.max``, ``tl.sum``, ...) are interpreted only when that is set before triton is
imported. ``python -m support.varlen_attention_cases`` prints one JSON object: each case's largest error against
its reference, and what the module case saw.
"""

import json
import math
import sys

import torch
import torch.nn.functional as F

from bionemo.layers.rotary import RotarySelfAttention, apply_rotary, rotary_tables
from support.attention import angles, self_attention

KERNEL_CASES = [  # head_dim, dtype, RoPE, (block_m, block_n)
    (16, "float32", True, (16, 16)),
    (24, "float32", True, (16, 32)),  # a head dim that is no power of two (masked lanes)
    (32, "float32", False, (32, 16)),
    (32, "float16", True, (16, 16)),  # half precision: fp16 (the interpreter has no bf16 matrix product)
    (32, "float16", True, (64, 64)),  # the GPU launch's tiles: every sequence in one partial tile
]


def case_name(head_dim: int, dtype: str, rope: bool, blocks: tuple[int, int]) -> str:
    return f"{head_dim}-{dtype}-{'rope' if rope else 'plain'}-{blocks[0]}x{blocks[1]}"


def reference(query, key, value, lengths, scale, rotary):
    """Each sequence on its own: eager RoPE (fp32) rounded to the inputs' dtype, then fp32 softmax attention."""
    if rotary is not None:
        cos, sin = rotary
        query, key = (apply_rotary(t.float().unsqueeze(1), cos.float(), sin.float()).squeeze(1) for t in (query, key))
        query, key = query.to(value.dtype), key.to(value.dtype)
    outs, start = [], 0
    for n in lengths:
        q, k, v = (t[start : start + n].float().transpose(0, 1) for t in (query, key, value))  # [h, n, d]
        outs.append(F.scaled_dot_product_attention(q, k, v, scale=scale).transpose(0, 1))
        start += n
    return torch.cat(outs)


def kernel_error(head_dim: int, dtype_name: str, rope: bool, blocks: tuple[int, int]) -> float:
    """Strided query/key/value slices of a fused QKV projection; sequences of 1 token and longer than a tile."""
    from bionemo.layers._varlen_attention_triton import attend_unpadded

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    lengths, heads = [5, 1, 37, 16, 2], 3
    tokens = sum(lengths)
    mixed = torch.randn(tokens, heads, 3 * head_dim, dtype=dtype)  # per head [q k v], as megatron's projection
    query, key, value = mixed[..., :head_dim], mixed[..., head_dim : 2 * head_dim], mixed[..., 2 * head_dim :]
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    positions = torch.cat([torch.arange(n) for n in lengths])
    rotary = rotary_tables(angles(max(lengths), head_dim, 1)[positions], dtype) if rope else None
    scale = 0.7 / math.sqrt(head_dim)
    out = attend_unpadded(
        query, key, value, bounds, max(lengths), scale=scale, rotary=rotary, block_m=blocks[0], block_n=blocks[1]
    )
    assert out.shape == (tokens, heads, head_dim)
    assert out.dtype == dtype
    return float((out.float() - reference(query, key, value, lengths, scale, rotary)).abs().max())


def module_case(dtype_name: str) -> dict:
    """RotarySelfAttention predicting unpadded, the kernel stood in as available on CPU, against it switched off.

    Returns the largest output difference, the kernel calls (with RoPE or not) and whether the caller's
    parameters were left unchanged.
    """
    from megatron.core.transformer.transformer_config import TransformerConfig

    import bionemo.layers._varlen_attention_triton as kernel
    import bionemo.layers.sdpa_attention as sdpa
    from bionemo.layers import UnpaddedSequences
    from bionemo.lightning import ensure_model_parallel

    dtype = getattr(torch, dtype_name)
    ensure_model_parallel()
    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=1, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True, attention_dropout=0.0,
        hidden_dropout=0.0, params_dtype=dtype,
    )  # fmt: skip
    module = self_attention(RotarySelfAttention, config).to(dtype).eval()
    lengths = [5, 19, 3]
    positions = torch.cat([torch.arange(n) for n in lengths])
    sequence_ids = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))
    bounds = torch.tensor([0, 5, 24, 27], dtype=torch.int32)
    packed = UnpaddedSequences(boundaries=bounds, longest=19, sequence_ids=sequence_ids, positions=positions)
    hidden = torch.randn(27, 1, 64, dtype=dtype)
    freqs = angles(19, 16, 1)[positions]
    calls = []
    compiled = kernel.attend_unpadded

    def counted(*args, **kwargs):
        calls.append(kwargs.get("rotary") is not None)
        return compiled(*args, **kwargs)

    available = sdpa.triton_attention_available
    with torch.inference_mode():
        off, _ = module(hidden, None, rotary_pos_emb=freqs, packed_seq_params=packed)
        kernel.attend_unpadded = counted
        sdpa.triton_attention_available = lambda x: not torch.is_grad_enabled()  # CUDA stood in for
        try:
            on, _ = module(hidden, None, rotary_pos_emb=freqs, packed_seq_params=packed)
        finally:
            kernel.attend_unpadded, sdpa.triton_attention_available = compiled, available
    return {
        "difference": float((on.float() - off.float()).abs().max()),
        "calls": calls,
        "unchanged": packed.rotary_angles is None,
    }


def main() -> None:
    errors = {case_name(*case): kernel_error(*case) for case in KERNEL_CASES}
    modules = {name: module_case(name) for name in ("float32", "float16")}
    json.dump({"kernel": errors, "module": modules}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
