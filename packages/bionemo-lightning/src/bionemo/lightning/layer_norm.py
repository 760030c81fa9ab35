"""LayerNorm for prediction on GPUs in one Triton pass per row, behind a switch until measured on a GPU.

Without Apex, megatron-core's local layer spec builds ``torch.nn.LayerNorm`` (``WrappedTorchNorm``). On an H200 its
kernel moved 1.3 TB/s on a 65,536 x 640 bf16 batch (128 us per call, 61 calls per ESM-2 150M forward: 11% of the
kernel time of a prediction batch, tools/profile_predict_loop.py), a quarter of the memory bandwidth.
:class:`TritonLayerNorm` is a ``torch.nn.LayerNorm`` (same parameters, same state dict) whose forward runs one
Triton kernel when nothing needs a gradient (prediction, validation) on a contiguous CUDA tensor, and torch's
kernel otherwise (training is unchanged).

Switch: ``BIONEMO_TRITON_LAYERNORM=1`` when the model is built (off by default: its gain is not measured yet).
"""

import os
from typing import Any

import torch

from bionemo.lightning._triton import triton_importable

__all__ = ["TritonLayerNorm", "local_layer_norm", "triton_layer_norm_enabled"]

SWITCH = "BIONEMO_TRITON_LAYERNORM"


def triton_layer_norm_enabled() -> bool:
    """Whether :func:`local_layer_norm` builds :class:`TritonLayerNorm` (``BIONEMO_TRITON_LAYERNORM=1``)."""
    return os.environ.get(SWITCH, "0") == "1"


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
    """Build megatron's local (torch) norm, as a :class:`TritonLayerNorm` where the switch is on and it is LayerNorm.

    Takes ``WrappedTorchNorm``'s arguments, so it can stand in for it in a megatron layer spec.
    """

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> torch.nn.Module:
        """``WrappedTorchNorm(config, hidden_size, eps, ...)``, as a :class:`TritonLayerNorm` when switched on."""
        from megatron.core.transformer.torch_norm import WrappedTorchNorm

        norm = WrappedTorchNorm(config, hidden_size, eps, **kwargs)  # megatron's checks and its choice of norm
        if not triton_layer_norm_enabled() or type(norm) is not torch.nn.LayerNorm:
            return norm
        return TritonLayerNorm(hidden_size, eps=eps)  # built as WrappedTorchNorm builds torch's (ones and zeros)
