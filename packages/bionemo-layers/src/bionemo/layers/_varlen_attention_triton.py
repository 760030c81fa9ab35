"""The Triton kernel behind :class:`bionemo.layers.SDPACoreAttention`'s unpadded prediction forward on GPUs.

Bidirectional attention over concatenated sequences (megatron's ``thd`` layout), forward only, with the rotary
position embedding of the query and the key applied as their tiles are loaded: one kernel instead of two RoPE
passes over memory and torch's variable-length flash kernel. Each program takes ``BLOCK_M`` queries of one
sequence and one head and runs the online softmax (fp32, base 2) over that sequence's keys in ``BLOCK_N`` tiles.
Query, key and value are read through their strides (the slices of megatron's fused QKV projection, no copies);
the rotation is computed in fp32 and rounded to the inputs' dtype before the products, as the separate RoPE kernel
does (:mod:`bionemo.layers._rotary_triton`).
"""

import math
from typing import Any

import torch
import triton
import triton.language as tl

from bionemo.layers._triton import next_power_of_2

__all__ = ["attend_unpadded"]


# the sequence count and the bounds change from batch to batch: one compiled kernel for all of them
@triton.jit(do_not_specialize=["sequences"])
def _varlen_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    bounds_ptr,
    out_ptr,
    sequences,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    scale_log2,
    HEAD_DIM: tl.constexpr,
    DIM_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROPE: tl.constexpr,
):
    block = tl.program_id(0)
    sequence = tl.program_id(1)
    head = tl.program_id(2).to(tl.int64)
    start = tl.load(bounds_ptr + sequence).to(tl.int64)
    length = tl.load(bounds_ptr + sequence + 1).to(tl.int64) - start
    if block * BLOCK_M >= length:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < length
    dim = tl.arange(0, DIM_BLOCK)
    dim_ok = dim < HEAD_DIM
    half = HEAD_DIM // 2
    partner = tl.where(dim < half, dim + half, dim - half)  # rotate_half: (-x2, x1)
    sign = tl.where(dim < half, -1.0, 1.0)
    query_tokens = start + rows
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q_rows = q_ptr + query_tokens[:, None] * stride_qt + head * stride_qh
    q = tl.load(q_rows + dim[None, :], mask=q_mask, other=0.0)
    if ROPE:
        tables = query_tokens[:, None] * HEAD_DIM + dim[None, :]
        cos = tl.load(cos_ptr + tables, mask=q_mask, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + tables, mask=q_mask, other=0.0).to(tl.float32)
        turned = tl.load(q_rows + partner[None, :], mask=q_mask, other=0.0).to(tl.float32)
        q = (q.to(tl.float32) * cos + sign[None, :] * turned * sin).to(q_ptr.dtype.element_ty)
    running_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, DIM_BLOCK), dtype=tl.float32)
    for first in range(0, length, BLOCK_N):
        cols = first + tl.arange(0, BLOCK_N)
        col_ok = cols < length
        key_tokens = start + cols
        kv_mask = col_ok[:, None] & dim_ok[None, :]
        k_rows = k_ptr + key_tokens[:, None] * stride_kt + head * stride_kh
        k = tl.load(k_rows + dim[None, :], mask=kv_mask, other=0.0)
        if ROPE:
            tables = key_tokens[:, None] * HEAD_DIM + dim[None, :]
            cos = tl.load(cos_ptr + tables, mask=kv_mask, other=0.0).to(tl.float32)
            sin = tl.load(sin_ptr + tables, mask=kv_mask, other=0.0).to(tl.float32)
            turned = tl.load(k_rows + partner[None, :], mask=kv_mask, other=0.0).to(tl.float32)
            k = (k.to(tl.float32) * cos + sign[None, :] * turned * sin).to(k_ptr.dtype.element_ty)
        scores = tl.dot(q, tl.trans(k)) * scale_log2
        scores = tl.where(col_ok[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        p = tl.exp2(scores - new_max[:, None])
        alpha = tl.exp2(running_max - new_max)
        running_sum = running_sum * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + key_tokens[:, None] * stride_vt + head * stride_vh + dim[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        running_max = new_max
    out = acc / running_sum[:, None]
    target = out_ptr + query_tokens[:, None] * stride_ot + head * stride_oh + dim[None, :]
    tl.store(target, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def attend_unpadded(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bounds: torch.Tensor,
    longest: int,
    *,
    scale: float | None = None,
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """softmax(QK^T * scale) V within each sequence of concatenated ``query, key, value [T, heads, d]``.

    Any token and head strides, unit stride in ``d``. ``bounds [n + 1]`` (int32) holds the sequences' first tokens
    and ``T``, ``longest`` the longest sequence's length. ``rotary``: per-token ``(cos, sin) [T, d]`` (contiguous)
    to rotate query and key by first (non-interleaved RoPE). Returns ``[T, heads, d]`` (contiguous) in the inputs'
    dtype. The tiles and launch settings are keyword arguments for measuring; the defaults are the measured ones.
    """
    tokens, heads, head_dim = query.shape
    out = torch.empty((tokens, heads, head_dim), dtype=query.dtype, device=query.device)
    sequences = bounds.numel() - 1
    if tokens == 0 or sequences == 0:
        return out
    cos, sin = rotary if rotary is not None else (query, query)  # unread without ROPE
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    grid: Any = (-(-longest // block_m), sequences, heads)
    kernel: Any = _varlen_attention_kernel
    kernel[grid](
        query, key, value, cos, sin, bounds, out, sequences,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        out.stride(0), out.stride(1), scale * math.log2(math.e),
        HEAD_DIM=head_dim, DIM_BLOCK=max(16, next_power_of_2(head_dim)), BLOCK_M=block_m, BLOCK_N=block_n,
        ROPE=rotary is not None, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out
