"""Bidirectional attention over packed variable-length sequences with RoPE applied inside, forward only, in Triton.

One kernel for prediction on GPUs in place of two steps: :func:`bionemo.layers.rotary.apply_rotary` on the query
and the key, then torch's variable-length flash forward (:func:`bionemo.layers.sdpa_attention.varlen_flash_attention`).
Imported on first CUDA use.

Contract of :func:`varlen_rotary_attention`: ``query``, ``key``, ``value`` ``[T, heads, d]`` (any strides in the first
two dimensions, unit stride in ``d``: views into megatron's fused QKV projection are read in place), sequences
concatenated and cut at ``bounds`` (int32 ``[n + 1]``, ``cu_seqlens``), ``longest`` at least every sequence's
length. Each token attends to every token of its own sequence (no causal mask, no dropout). RoPE (optional,
``cos``/``sin [T, d]`` from :func:`bionemo.layers.rotary.rotary_tables`) rotates query and key as
:func:`~bionemo.layers.rotary.apply_rotary`'s kernel does: ``x * cos + rotate_half(x) * sin`` in fp32 over the two
halves of ``d``, rounded to the input dtype before the product. Returns a new contiguous ``[T, heads * d]`` tensor in
the input dtype.

Kernel: one program per (block of ``BLOCK_M`` queries of one sequence, head), on a 1-D grid of
``cdiv(longest, BLOCK_M) * heads * n`` programs (no 65,535 limit on the sequence count); a program whose block starts
past its sequence's end returns at once. It rotates its queries once, then walks the sequence's keys ``BLOCK_N`` at a
time (never another sequence's tokens): loads a key block as two halves, rotates them (for sequences longer than 192
tokens the keys are rotated once before the kernel instead, :func:`keys_rotated_first`), takes the scores as two
products ``q1 k1^T + q2 k2^T`` in fp32, and keeps an online softmax (base 2, ``scale * log2(e)`` applied to the fp32
scores) with the probabilities rounded to the input dtype for the product with the values, as flash attention does.
Full key blocks run unmasked; the sequence's last partial block masks keys past its end. Each half is padded to at
least 16 columns (``tl.dot``'s smallest reduction on GPUs; ESM-2 8M's ``d = 16`` and 35M's ``d = 24``), the padding
loaded as zeros.
"""

import math
import os
from typing import Any

import torch
import triton
import triton.language as tl

from bionemo.layers._rotary_triton import rotate_strided
from bionemo.layers._triton import cdiv, next_power_of_2
from bionemo.layers._triton_key import remember_compiler_key

remember_compiler_key()  # this process's first kernel launch skips hashing libtriton (see _triton_key)

__all__ = [
    "KEYS_FIRST_LONGER_THAN",
    "KEYS_ROTATED_FIRST",
    "TILING",
    "default_tiling",
    "keys_rotated_first",
    "varlen_rotary_attention",
]

Tiling = tuple[int, int, int, int]
"""``(BLOCK_M, BLOCK_N, num_warps, num_stages)``: queries per program, keys per step, warps, pipeline stages."""

TILING: Tiling | None = None
"""The kernel's tiling for every call without a ``tiling`` argument; ``None``: :func:`default_tiling`. Set it to try
one setting (``tools/bench_varlen_attention.py``)."""

KEYS_ROTATED_FIRST: bool | None = None
"""With RoPE, where the keys are rotated: ``True``, once before the attention kernel (``rotate_strided``, one pass over
them); ``False``, in the kernel's inner loop, each key block once per block of queries; ``None``:
:func:`keys_rotated_first` decides by length. Set it to try one place (``tools/bench_varlen_attention.py``)."""

KEYS_FIRST_LONGER_THAN = 192
""":func:`keys_rotated_first`'s length: longer sequences have their keys rotated before the kernel."""

LOG2_E = math.log2(math.e)


def keys_rotated_first(longest: int) -> bool:
    """Whether keys of sequences of at most ``longest`` tokens are rotated before the kernel (or as set, if set).

    By default, for sequences longer than :data:`KEYS_FIRST_LONGER_THAN` tokens: their keys would be rotated in the
    kernel's loop once for each of three or more query blocks, which costs more than one pass over them first
    (``tools/bench_varlen_attention.py`` on an H100, 20 heads, 131k-token batches: keys first 1.21x faster at 271-282
    tokens and 1.20x at 721-765 for head dim 64, 1.16x / 1.28x for head dim 32 with 3 stages against the loop's 1;
    0.97x / 0.95x at 104-129 tokens).
    """
    if KEYS_ROTATED_FIRST is not None:
        return KEYS_ROTATED_FIRST
    return longest > KEYS_FIRST_LONGER_THAN


def default_tiling(head_dim: int, longest: int) -> Tiling:
    """The tiling for heads of ``head_dim`` and sequences of at most ``longest`` tokens (:data:`TILING` if set).

    The fastest of ``tools/bench_varlen_attention.py``'s sweep on an H100 (20 heads, bf16, length-sorted batches of
    about 128k tokens): always 4 warps; 64 queries a program and 32 keys a step up to 512 tokens (sequences of 104-129
    and 271-282), 3 stages but at ``d = 32`` with the keys rotated in the loop (1 stage); 128 queries, 3 stages beyond
    (721-765).
    """
    if TILING is not None:
        return TILING
    if longest > 512:
        return 128, 64 if head_dim >= 64 else 32, 4, 3
    return 64, 32, 4, 3 if head_dim >= 64 or keys_rotated_first(longest) else 1


@triton.jit
def _load_halves(ptr, cos_ptr, sin_ptr, token, stride_t, head_offset, half_col, mask,
                 HALF: tl.constexpr, ROPE: tl.constexpr):  # fmt: skip
    """Rows ``token`` ``[rows]`` of one head as two halves ``[rows, HALF_BLOCK]``, rotated if ``ROPE``, input dtype."""
    source = (token * stride_t + head_offset)[:, None] + half_col[None, :]
    x1 = tl.load(ptr + source, mask=mask, other=0.0)
    x2 = tl.load(ptr + source + HALF, mask=mask, other=0.0)
    if ROPE:  # x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1), in fp32
        table = (token * (2 * HALF))[:, None] + half_col[None, :]
        cos1 = tl.load(cos_ptr + table, mask=mask, other=0.0).to(tl.float32)
        cos2 = tl.load(cos_ptr + table + HALF, mask=mask, other=0.0).to(tl.float32)
        sin1 = tl.load(sin_ptr + table, mask=mask, other=0.0).to(tl.float32)
        sin2 = tl.load(sin_ptr + table + HALF, mask=mask, other=0.0).to(tl.float32)
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        x1 = (f1 * cos1 - f2 * sin1).to(ptr.dtype.element_ty)
        x2 = (f2 * cos2 + f1 * sin2).to(ptr.dtype.element_ty)
    return x1, x2


@triton.jit
def _attend_keys(acc, row_sum, row_max, q1, q2, k_ptr, v_ptr, cos_ptr, sin_ptr, start, length, first, last,
                 stride_kt, k_head, stride_vt, v_head, half_col, col, qk_scale,
                 HALF: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, ROPE: tl.constexpr,
                 MASKED: tl.constexpr, DOT_TYPE: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """The online softmax over key blocks ``first, first + BLOCK_N, ... < last`` of a sequence starting at ``start``.

    ``MASKED``: keys at or past ``length`` are left out (the last, partial block); otherwise every key is in range.
    """
    for block in range(first, last, BLOCK_N):
        position = block + tl.arange(0, BLOCK_N)
        in_sequence = position < length
        token = start + position
        half_mask = (in_sequence[:, None] & (half_col < HALF)[None, :]) if MASKED else (half_col < HALF)[None, :]
        k1, k2 = _load_halves(k_ptr, cos_ptr, sin_ptr, token, stride_kt, k_head, half_col, half_mask, HALF, ROPE)
        scores = tl.dot(q1.to(DOT_TYPE), tl.trans(k1.to(DOT_TYPE)), input_precision=PRECISION)
        scores = tl.dot(q2.to(DOT_TYPE), tl.trans(k2.to(DOT_TYPE)), scores, input_precision=PRECISION)
        scores = scores * qk_scale
        if MASKED:
            scores = tl.where(in_sequence[None, :], scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))  # finite: every block holds a key of the sequence
        probabilities = tl.exp2(scores - new_max[:, None])
        correction = tl.exp2(row_max - new_max)
        row_sum = row_sum * correction + tl.sum(probabilities, 1)
        value_mask = (in_sequence[:, None] & (col < D)[None, :]) if MASKED else (col < D)[None, :]
        value = tl.load(v_ptr + (token * stride_vt + v_head)[:, None] + col[None, :], mask=value_mask, other=0.0)
        probabilities = probabilities.to(v_ptr.dtype.element_ty)  # as flash attention: P in the input dtype
        acc = tl.dot(
            probabilities.to(DOT_TYPE), value.to(DOT_TYPE), acc * correction[:, None], input_precision=PRECISION
        )
        row_max = new_max
    return acc, row_sum, row_max


# the sequence count and block count change from batch to batch: one compiled kernel for all of them
@triton.jit(do_not_specialize=["blocks"])
def _varlen_attention_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, out_ptr, bounds_ptr, qk_scale, blocks, heads,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    HALF: tl.constexpr, HALF_BLOCK: tl.constexpr, D_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, ROPE_Q: tl.constexpr, ROPE_K: tl.constexpr, DOT_TYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    program = tl.program_id(0)
    block = program % blocks
    head = (program // blocks) % heads
    sequence = program // (blocks * heads)
    start = tl.load(bounds_ptr + sequence).to(tl.int64)  # int64 tokens: offsets past 2**31 elements
    length = (tl.load(bounds_ptr + sequence + 1) - start).to(tl.int32)
    if block * BLOCK_M >= length:
        return
    position = block * BLOCK_M + tl.arange(0, BLOCK_M)
    in_sequence = position < length
    token = start + position
    half_col = tl.arange(0, HALF_BLOCK)
    col = tl.arange(0, D_BLOCK)
    half_mask = in_sequence[:, None] & (half_col < HALF)[None, :]
    q1, q2 = _load_halves(
        q_ptr, cos_ptr, sin_ptr, token, stride_qt, head * stride_qh, half_col, half_mask, HALF, ROPE_Q
    )

    acc = tl.zeros((BLOCK_M, D_BLOCK), dtype=tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    row_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    full = length - length % BLOCK_N
    acc, row_sum, row_max = _attend_keys(
        acc, row_sum, row_max, q1, q2, k_ptr, v_ptr, cos_ptr, sin_ptr, start, length, 0, full,
        stride_kt, head * stride_kh, stride_vt, head * stride_vh, half_col, col, qk_scale,
        HALF, 2 * HALF, BLOCK_N, ROPE_K, tl.constexpr(False), DOT_TYPE, PRECISION,
    )  # fmt: skip
    acc, row_sum, row_max = _attend_keys(
        acc, row_sum, row_max, q1, q2, k_ptr, v_ptr, cos_ptr, sin_ptr, start, length, full, length,
        stride_kt, head * stride_kh, stride_vt, head * stride_vh, half_col, col, qk_scale,
        HALF, 2 * HALF, BLOCK_N, ROPE_K, tl.constexpr(True), DOT_TYPE, PRECISION,
    )  # fmt: skip
    out = acc / row_sum[:, None]
    target = (token * (heads * 2 * HALF) + head * (2 * HALF))[:, None] + col[None, :]
    out_mask = in_sequence[:, None] & (col < 2 * HALF)[None, :]
    tl.store(out_ptr + target, out.to(out_ptr.dtype.element_ty), mask=out_mask)


def _dot_settings(x: torch.Tensor) -> tuple[Any, str]:
    """``tl.dot``'s operand type and fp32 precision: the input dtype on GPUs (fp32 exactly, not as tf32).

    Triton's CPU interpreter multiplies bf16 operands as their raw 16-bit patterns: there both go to fp32 first (the
    same products, exact in fp32, and fp32 sums).
    """
    interpreted = x.device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1"
    if interpreted or x.dtype == torch.float32:
        return tl.float32, "ieee"
    return (tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float16), "tf32"


def _check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: torch.Tensor) -> None:
    if query.dim() != 3 or key.shape != query.shape or value.shape != query.shape:
        shapes = [tuple(t.shape) for t in (query, key, value)]
        raise ValueError(f"query, key and value must all be [T, heads, d], got {shapes}")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"query, key and value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    d = query.shape[-1]
    if d % 2 or not 2 <= d <= 256:
        raise ValueError(f"head dimension d must be even and in 2..256, got {d}")
    if bounds.dim() != 1 or bounds.numel() < 1 or bounds.dtype != torch.int32:
        raise ValueError(f"bounds must be int32 [n + 1], got {bounds.dtype} {tuple(bounds.shape)}")


def varlen_rotary_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bounds: torch.Tensor,
    longest: int,
    scale: float | None = None,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    tiling: Tiling | None = None,
) -> torch.Tensor:
    """softmax(rope(Q) rope(K)^T * scale) V within each sequence of ``[T, heads, d]`` tensors cut at ``bounds``.

    Args:
        query: ``[T, heads, d]``, unit stride in ``d`` (else copied); bf16 or fp16 on GPUs (fp32 works too).
        key: like ``query``.
        value: like ``query``.
        bounds: int32 ``[n + 1]``, sequence ``i`` is tokens ``bounds[i]:bounds[i + 1]`` (``bounds[0] = 0``,
            ``bounds[n] = T``); empty sequences are allowed.
        longest: at least the longest sequence's length (rows past it in a longer sequence are not computed).
        scale: the scores' factor; ``None``: ``d ** -0.5``.
        cos: ``[T, d]`` per-token cosines (:func:`bionemo.layers.rotary.rotary_tables`), or ``None`` (with ``sin``)
            for no RoPE.
        sin: ``[T, d]`` per-token sines, or ``None``.
        tiling: ``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` (powers of two, blocks at least 16); ``None``:
            :data:`TILING` or :func:`default_tiling`.

    Returns:
        A new contiguous ``[T, heads * d]`` tensor in ``query``'s dtype.
    """
    _check(query, key, value, bounds)
    if (cos is None) != (sin is None):
        raise ValueError("cos and sin must be given together (RoPE) or both be None")
    tokens, heads, d = query.shape
    if cos is not None and sin is not None:
        if cos.shape != (tokens, d) or sin.shape != (tokens, d):
            raise ValueError(f"cos and sin must be [T, d] = {[tokens, d]}, got {list(cos.shape)}, {list(sin.shape)}")
        cos, sin = cos.contiguous(), sin.contiguous()
    query, key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
    out = torch.empty((tokens, heads * d), dtype=query.dtype, device=query.device)
    sequences = bounds.numel() - 1
    if tokens == 0 or heads == 0 or sequences == 0 or longest <= 0:
        return out
    block_m, block_n, warps, stages = tiling if tiling is not None else default_tiling(d, longest)
    rope_keys = cos is not None
    if cos is not None and sin is not None and keys_rotated_first(longest):
        key = rotate_strided(key.unsqueeze(1), cos, sin).squeeze(1)
        rope_keys = False
    half = d // 2
    blocks = cdiv(longest, block_m)
    dot_type, precision = _dot_settings(query)
    kernel: Any = _varlen_attention_kernel
    kernel[(blocks * heads * sequences,)](
        query, key, value, query if cos is None else cos, query if sin is None else sin, out, bounds,
        (d**-0.5 if scale is None else scale) * LOG2_E, blocks, heads,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        HALF=half, HALF_BLOCK=max(16, next_power_of_2(half)), D_BLOCK=max(16, next_power_of_2(d)), BLOCK_M=block_m,
        BLOCK_N=block_n, ROPE_Q=cos is not None, ROPE_K=rope_keys, DOT_TYPE=dot_type, PRECISION=precision,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out
