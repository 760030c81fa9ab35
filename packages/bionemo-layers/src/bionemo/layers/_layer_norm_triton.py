"""The Triton kernels behind :class:`bionemo.layers.layer_norm.TritonLayerNorm` on GPUs (imported on first CUDA use).

Forward: each program takes one or a few rows (tokens; :func:`forward_tiling`), loads each once (in prediction
optionally adding a constant vector to it first, for :mod:`bionemo.layers.residual_gemm`), takes mean and variance
in fp32, normalizes, scales, shifts and stores in the output's dtype; for training it also keeps each row's mean
and reciprocal standard deviation (fp32). Backward (the Triton tutorial's scheme): each program takes a contiguous
run of rows, writes their input gradient and sums its rows' weight and bias gradients in fp32 registers; the
per-program partial sums are then added up by torch (one ``[2, programs, width]`` fp32 buffer for both parameters,
one reduction).
"""

import functools
from typing import Any

import torch
import triton
import triton.language as tl

from bionemo.layers._triton import cdiv, next_power_of_2
from bionemo.layers._triton_key import remember_compiler_key

remember_compiler_key()  # this process's first kernel launch skips hashing libtriton (see _triton_key)

__all__ = ["TrainingLayerNorm", "layer_norm_rows"]


@triton.jit
def _layer_norm_kernel(
    x_ptr, offset_ptr, weight_ptr, bias_ptr, out_ptr, mean_ptr, rstd_ptr, rows, width, eps,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, STATS: tl.constexpr, OFFSET: tl.constexpr,
):  # fmt: skip
    first = tl.program_id(0).to(tl.int64) * ROWS  # int64 rows: offsets past 2**31 elements
    row = first + tl.arange(0, ROWS)  # [ROWS]
    col = tl.arange(0, BLOCK)[None, :]  # [1, BLOCK]
    in_row = col < width
    mask = (row[:, None] < rows) & in_row
    x = tl.load(x_ptr + row[:, None] * width + col, mask=mask, other=0.0).to(tl.float32)
    if OFFSET:
        x += tl.load(offset_ptr + col, mask=in_row, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / width
    centered = tl.where(mask, x - mean[:, None], 0.0)
    variance = tl.sum(centered * centered, axis=1) / width
    scale = 1.0 / tl.sqrt(variance + eps)
    weight = tl.load(weight_ptr + col, mask=in_row, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + col, mask=in_row, other=0.0).to(tl.float32)
    y = centered * scale[:, None] * weight + bias
    tl.store(out_ptr + row[:, None] * width + col, y.to(out_ptr.dtype.element_ty), mask=mask)
    if STATS:
        tl.store(mean_ptr + row, mean, mask=row < rows)
        tl.store(rstd_ptr + row, scale, mask=row < rows)


@triton.jit
def _layer_norm_backward_kernel(
    dy_ptr, x_ptr, weight_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr, rows, width, rows_per_program,
    BLOCK: tl.constexpr,
):  # fmt: skip
    program = tl.program_id(0)
    col = tl.arange(0, BLOCK)
    mask = col < width
    weight = tl.load(weight_ptr + col, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    db = tl.zeros((BLOCK,), dtype=tl.float32)
    first = program.to(tl.int64) * rows_per_program  # int64 rows: offsets past 2**31 elements
    for row in range(first, tl.minimum(first + rows_per_program, rows)):
        offset = row * width + col
        x = tl.load(x_ptr + offset, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offset, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        normalized = tl.where(mask, (x - tl.load(mean_ptr + row)) * rstd, 0.0)
        weighted = weight * dy  # zero in masked lanes (weight loaded as 0 there)
        c1 = tl.sum(normalized * weighted, axis=0) / width
        c2 = tl.sum(weighted, axis=0) / width
        dx = (weighted - (normalized * c1 + c2)) * rstd
        tl.store(dx_ptr + offset, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * normalized
        db += dy
    tl.store(dw_ptr + program * width + col, dw, mask=mask)
    tl.store(db_ptr + program * width + col, db, mask=mask)


def _shape(x: torch.Tensor) -> tuple[int, int, int]:
    """``(rows, width, BLOCK)``: the rows of the last dimension, its width and the power-of-two block holding it."""
    width = x.shape[-1]
    return (x.numel() // width if width else 0), width, next_power_of_2(width)


def _num_warps(block: int) -> int:
    return min(max(block // 256, 1), 8)


FORWARD_TILING: tuple[int, int] | None = None
"""The forward's ``(rows per program, warps)``; ``None``: by width (:func:`forward_tiling`). Set it to try one
setting for every width."""


FORWARD_ELEMENTS_PER_PROGRAM = 4096
"""Lanes one forward program holds at most (rows x block, four warps, at most 4 rows), for rows held in up to half
as many lanes; wider rows take one row a program and up to eight warps. Measured on an H100 at widths 640 and 1280
(docs/benchmarks.md#layernorm-kernels): 4 and 2 rows per program with 4 warps reached 3.0 TB/s on 131,072 rows,
one row 2.5-2.8 TB/s."""


def forward_tiling(block: int) -> tuple[int, int]:
    """The forward's rows per program and warps for rows held in ``block`` lanes (:data:`FORWARD_TILING` if set)."""
    if FORWARD_TILING is not None:
        return FORWARD_TILING
    if block <= FORWARD_ELEMENTS_PER_PROGRAM // 2:
        return min(4, FORWARD_ELEMENTS_PER_PROGRAM // block), 4
    return 1, _num_warps(block)


def _launch_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    stats: bool,
    offset: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, width, block = _shape(x)
    out = torch.empty_like(x)
    mean, rstd = torch.empty(2, rows if stats else 0, device=x.device, dtype=torch.float32)  # one allocation
    if rows == 0:
        return out, mean, rstd
    per_program, warps = forward_tiling(block)
    kernel: Any = _layer_norm_kernel
    kernel[(cdiv(rows, per_program),)](
        x, x if offset is None else offset, weight, bias, out, mean, rstd, rows, width, eps,
        BLOCK=block, ROWS=per_program, STATS=stats, OFFSET=offset is not None, num_warps=warps,
    )  # fmt: skip
    return out, mean, rstd


def layer_norm_rows(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, offset: torch.Tensor | None = None
) -> torch.Tensor:
    """LayerNorm over the last dimension of a contiguous ``x``; a new tensor of ``x``'s shape and dtype.

    ``offset`` (a ``[width]`` vector, or None) is added to every row in fp32 first.
    """
    return _launch_forward(x, weight, bias, eps, stats=False, offset=offset)[0]


BACKWARD_PROGRAMS_PER_SM: int | None = None
"""Backward programs per multiprocessor; ``None``: by width (:func:`backward_programs_per_sm`). Set it to try one
setting for every width (``tools/bench_layer_norm.py --per-sm``)."""

NARROW_WIDTH = 640
"""Widths up to this run the backward with 16 programs per multiprocessor, wider ones with 4: the faster of the two
at ESM-2's widths 640 and 1280 on an H200, since more programs share out narrow rows better but leave more partial
sums to reduce (docs/benchmarks.md#layernorm-kernels)."""


def backward_programs_per_sm(width: int) -> int:
    """Backward programs per multiprocessor for rows of ``width`` (:data:`BACKWARD_PROGRAMS_PER_SM` if set)."""
    if BACKWARD_PROGRAMS_PER_SM is not None:
        return BACKWARD_PROGRAMS_PER_SM
    return 16 if width <= NARROW_WIDTH else 4


def _backward_programs(rows: int, width: int, device: torch.device) -> int:
    """Programs for the backward: a few per multiprocessor, so that the partial sums stay small."""
    if device.type != "cuda":
        return max(1, min(rows, 4))  # Triton's CPU interpreter (tests)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return max(1, min(rows, backward_programs_per_sm(width) * _multiprocessors(index)))


@functools.cache
def _multiprocessors(index: int) -> int:
    """The multiprocessor count of GPU ``index`` (asked once per process and GPU)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def layer_norm_backward(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of the input, the weight and the bias (the parameters' in their dtype, summed in fp32)."""
    rows, width, block = _shape(x)
    dx = torch.empty_like(x)
    if rows == 0:
        return dx, torch.zeros_like(weight), torch.zeros_like(weight)
    programs = _backward_programs(rows, width, x.device)
    per_program = cdiv(rows, programs)
    programs = cdiv(rows, per_program)
    partial = torch.empty(2, programs, width, device=x.device, dtype=torch.float32)  # weight's, bias's
    kernel: Any = _layer_norm_backward_kernel
    kernel[(programs,)](
        dy, x, weight, mean, rstd, dx, partial[0], partial[1], rows, width, per_program,
        BLOCK=block, num_warps=_num_warps(block),
    )  # fmt: skip
    dw, db = partial.sum(dim=1).to(weight.dtype)  # one reduction and one cast for both
    return dx, dw, db


class TrainingLayerNorm(torch.autograd.Function):
    """LayerNorm over the last dimension of a contiguous tensor, forward and backward in Triton."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        out, mean, rstd = _launch_forward(x, weight, bias, eps, stats=True)
        ctx.save_for_backward(x, weight, mean, rstd)
        return out

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(grad_outputs[0].contiguous(), x, weight, mean, rstd)
        return dx, dw, db, None
