"""LayerNorm for prediction on GPUs in one Triton pass per row.

Without Apex, megatron-core's local layer spec builds ``torch.nn.LayerNorm`` (``WrappedTorchNorm``). On an H200 its
kernel moved 1.3 TB/s on a 65,536 x 640 bf16 batch (128 us per call, 61 calls per ESM-2 150M forward: 11% of the
kernel time of a prediction batch, tools/profile_predict_loop.py), a quarter of the memory bandwidth.
:class:`TritonLayerNorm` is a ``torch.nn.LayerNorm`` (same parameters, same state dict) whose forward runs one
Triton kernel when nothing needs a gradient (prediction, validation) on a contiguous CUDA tensor, and torch's
kernel otherwise (training is unchanged).

Measured on one H200 (``tools/profile_predict_loop.py --shape 650m -- --tokens-per-batch 65536``, 2026-12-01):
324,354 -> 330,250 tokens/s over the whole loop, kernels 190.7 -> 188.4 ms per batch (torch's LayerNorm was 6.9%
of the kernel time at 650M).

Switch: ``BIONEMO_TRITON_LAYERNORM=0`` when the model is built keeps torch's kernel everywhere.
"""

import os
from typing import Any

import torch

from bionemo.lightning._triton import triton_importable

__all__ = ["TritonLayerNorm", "local_layer_norm", "triton_layer_norm_enabled"]

SWITCH = "BIONEMO_TRITON_LAYERNORM"


def triton_layer_norm_enabled() -> bool:
    """Whether :func:`local_layer_norm` builds :class:`TritonLayerNorm` (unless ``BIONEMO_TRITON_LAYERNORM=0``)."""
    return os.environ.get(SWITCH, "1") != "0"


class TritonLayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` over the last dimension whose gradient-free CUDA forward is one Triton kernel."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """The Triton kernel for a contiguous CUDA ``input`` when no gradient is needed; torch's otherwise."""
        if self._fast_path(input):
            from bionemo.lightning._layer_norm_triton import layer_norm_rows

            return layer_norm_rows(input, self.weight, self.bias, self.eps)
        return super().forward(input)

    def _fast_path(self, x: torch.Tensor) -> bool:
        if self.weight is None or self.bias is None or len(self.normalized_shape) != 1:
            return False
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        return x.is_cuda and not needs_grad and x.is_contiguous() and triton_importable()


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
