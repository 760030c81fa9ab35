"""The Triton kernel behind :class:`bionemo.lightning.layer_norm.TritonLayerNorm` on GPUs (imported on first CUDA use).

One program per row (one token): loads the row once, takes mean and variance in fp32, normalizes, scales, shifts
and stores in the output's dtype. Forward only (the module uses torch's kernel wherever a gradient is needed).
"""

from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ["layer_norm_rows"]


@triton.jit
def _layer_norm_kernel(x_ptr, weight_ptr, bias_ptr, out_ptr, width, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < width
    x = tl.load(x_ptr + row * width + col, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / width
    centered = tl.where(mask, x - mean, 0.0)
    variance = tl.sum(centered * centered, axis=0) / width
    scale = 1.0 / tl.sqrt(variance + eps)
    weight = tl.load(weight_ptr + col, mask=mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + col, mask=mask, other=0.0).to(tl.float32)
    y = centered * scale * weight + bias
    tl.store(out_ptr + row * width + col, y.to(out_ptr.dtype.element_ty), mask=mask)


def layer_norm_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension of a contiguous ``x``; a new tensor of ``x``'s shape and dtype."""
    width = x.shape[-1]
    out = torch.empty_like(x)
    rows = x.numel() // width if width else 0
    if rows == 0:
        return out
    block = triton.next_power_of_2(width)
    kernel: Any = _layer_norm_kernel
    kernel[(rows,)](x, weight, bias, out, width, eps, BLOCK=block, num_warps=min(max(block // 256, 1), 8))
    return out
