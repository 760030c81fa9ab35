"""The Triton kernel behind :func:`bionemo.layers.rotary.apply_rotary` on GPUs (imported on first CUDA use).

One pass per tensor: each program loads ``BLOCK_ROWS`` rows (one row = one token of one head) of a strided
``[s, b, heads, d]`` view (the query or key slice of megatron's fused QKV projection), rotates the two halves
in fp32 and stores a contiguous result. ``BACKWARD`` applies the transposed rotation (the gradient).
"""

from typing import Any

import torch
import triton
import triton.language as tl

from bionemo.layers._triton import cdiv, next_power_of_2
from bionemo.layers._triton_key import remember_compiler_key

remember_compiler_key()  # this process's first kernel launch skips hashing libtriton (see _triton_key)

__all__ = ["rotate_strided"]


# rows and batch change from batch to batch (their divisibility by 16, batch == 1 when unpadded): one compiled kernel
# for all of them rather than one per specialization, each a Triton compile on a machine with an empty cache
@triton.jit(do_not_specialize=["rows", "batch"])
def _rotate_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    rows,
    batch,
    heads,
    stride_s,
    stride_b,
    stride_h,
    HALF: tl.constexpr,
    HALF_BLOCK: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BACKWARD: tl.constexpr,
):
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    col = tl.arange(0, HALF_BLOCK)
    mask = (row < rows)[:, None] & (col < HALF)[None, :]
    row = row.to(tl.int64)
    head = row % heads
    sample = (row // heads) % batch
    position = row // (heads * batch)
    source = (position * stride_s + sample * stride_b + head * stride_h)[:, None] + col[None, :]
    table = (position * (2 * HALF))[:, None] + col[None, :]
    x1 = tl.load(x_ptr + source, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + source + HALF, mask=mask, other=0.0).to(tl.float32)
    cos1 = tl.load(cos_ptr + table, mask=mask, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_ptr + table + HALF, mask=mask, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_ptr + table, mask=mask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_ptr + table + HALF, mask=mask, other=0.0).to(tl.float32)
    if BACKWARD:  # transpose of [[cos1, -sin1], [sin2, cos2]]
        y1 = x1 * cos1 + x2 * sin2
        y2 = x2 * cos2 - x1 * sin1
    else:
        y1 = x1 * cos1 - x2 * sin1
        y2 = x2 * cos2 + x1 * sin2
    target = (row * (2 * HALF))[:, None] + col[None, :]
    tl.store(out_ptr + target, y1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + target + HALF, y2.to(out_ptr.dtype.element_ty), mask=mask)


def rotate_strided(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, backward: bool = False) -> torch.Tensor:
    """Rotate ``x [s, b, heads, d]`` (any strides, unit stride in ``d``) by ``cos``/``sin [s, d]`` (contiguous).

    Returns a new contiguous tensor of ``x``'s shape and dtype.
    """
    s, b, h, d = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((s, b, h, d), dtype=x.dtype, device=x.device)
    rows = s * b * h
    if rows == 0:
        return out
    half = d // 2
    half_block = next_power_of_2(half)
    block_rows = max(1, min(64, 4096 // half_block))  # powers of two, about 4096 pairs per program
    grid: Any = (cdiv(rows, block_rows),)
    kernel: Any = _rotate_kernel
    kernel[grid](
        x, cos, sin, out, rows, b, h, x.stride(0), x.stride(1), x.stride(2),
        HALF=half, HALF_BLOCK=half_block, BLOCK_ROWS=block_rows, BACKWARD=backward,
    )  # fmt: skip
    return out
