"""LayerNorm on GPUs in Triton: one pass per row forward, a fused backward for training.

Without Apex, megatron-core's local layer spec builds ``torch.nn.LayerNorm`` (``WrappedTorchNorm``), whose kernel
uses a fraction of an H200's memory bandwidth on ESM-2's batches, two calls per layer
(docs/benchmarks.md#prediction-loop).
:class:`TritonLayerNorm` is a ``torch.nn.LayerNorm`` (same parameters, same state dict) whose forward runs one
Triton kernel on a contiguous CUDA tensor: when nothing needs a gradient (prediction, validation) that is all; in
training it also keeps each row's mean and reciprocal standard deviation, and the backward is one Triton kernel for
the input gradient and the per-program partial sums of the parameters' gradients
(:class:`bionemo.layers._layer_norm_triton.TrainingLayerNorm`). Anything else (CPU, a non-contiguous input)
runs torch's kernels.

Both kernels take less GPU time than torch's at ESM-2's widths, in prediction and in training
(``tools/bench_layer_norm.py``; docs/benchmarks.md#layernorm-kernels).

Switch: ``BIONEMO_TRITON_LAYERNORM=0`` when the model is built keeps torch's kernel everywhere.
"""

import os
from typing import Any

import torch

from bionemo.layers._triton import triton_importable

__all__ = ["TritonLayerNorm", "layer_norm_with_offset", "local_layer_norm", "triton_layer_norm_enabled"]

SWITCH = "BIONEMO_TRITON_LAYERNORM"


def triton_layer_norm_enabled() -> bool:
    """Whether :func:`local_layer_norm` builds :class:`TritonLayerNorm` (unless ``BIONEMO_TRITON_LAYERNORM=0``)."""
    return os.environ.get(SWITCH, "1") != "0"


def _triton_runs(x: torch.Tensor) -> bool:
    """Whether this package's Triton LayerNorm kernels take ``x``: a contiguous CUDA tensor, Triton installed."""
    return x.is_cuda and x.is_contiguous() and triton_importable()


class TritonLayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` over the last dimension whose CUDA forward and backward are Triton kernels."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Triton's kernels for a contiguous CUDA ``input`` (with a backward if a gradient is needed), else torch's."""
        if not self._fast_path(input):
            return super().forward(input)
        from bionemo.layers._layer_norm_triton import TrainingLayerNorm, layer_norm_rows

        if torch.is_grad_enabled() and (input.requires_grad or self.weight.requires_grad):
            return TrainingLayerNorm.apply(input, self.weight, self.bias, self.eps)
        return layer_norm_rows(input, self.weight, self.bias, self.eps)

    def _fast_path(self, x: torch.Tensor) -> bool:
        if self.weight is None or self.bias is None or len(self.normalized_shape) != 1:
            return False
        return _triton_runs(x)


def layer_norm_with_offset(norm: torch.nn.LayerNorm, x: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    """``norm(x + offset)`` without a gradient: ``offset`` (fp32 ``[width]``, or None) joins each row in fp32.

    One Triton kernel on a contiguous CUDA tensor (the offset loaded beside the weight and bias), else torch's
    arithmetic; ``norm`` is a ``torch.nn.LayerNorm`` over the last dimension with weight and bias (a
    :class:`TritonLayerNorm` or torch's own). For :mod:`bionemo.layers.residual_gemm`.
    """
    weight, bias = norm.weight, norm.bias
    if _triton_runs(x):
        from bionemo.layers._layer_norm_triton import layer_norm_rows

        return layer_norm_rows(x, weight, bias, norm.eps, offset)
    shifted = x if offset is None else x.float() + offset
    return torch.nn.functional.layer_norm(shifted, norm.normalized_shape, weight.float(), bias.float(), norm.eps).to(
        x.dtype
    )


class local_layer_norm:  # noqa: N801 - a module builder named like megatron's WrappedTorchNorm it stands in for
    """Build megatron's local (torch) norm, as a :class:`TritonLayerNorm` where it is LayerNorm and not switched off.

    Takes ``WrappedTorchNorm``'s arguments, so it can stand in for it in a megatron layer spec.
    """

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> torch.nn.Module:
        """``WrappedTorchNorm(config, hidden_size, eps, ...)``, as a :class:`TritonLayerNorm` unless switched off."""
        from megatron.core.transformer.torch_norm import WrappedTorchNorm

        norm = WrappedTorchNorm(config, hidden_size, eps, **kwargs)  # megatron's checks and its choice of norm
        if not triton_layer_norm_enabled() or type(norm) is not torch.nn.LayerNorm:
            return norm
        return TritonLayerNorm(hidden_size, eps=eps)  # built as WrappedTorchNorm builds torch's (ones and zeros)
