"""megatron-core's parallel linear layers with the bias added inside the matrix multiply, without tensor parallelism.

Without Transformer Engine, megatron-core 0.15.3's ``ColumnParallelLinear`` / ``RowParallelLinear`` multiply
(``torch.matmul``) and add the bias as a separate broadcasting kernel, either at once or later in the layer's
bias-dropout-add (``skip_bias_add``): four such adds per transformer layer, the largest share of an ESM-2
prediction batch's GPU time after the GEMMs on an H200 (docs/benchmarks.md#one-prediction-batch).
``torch.nn.functional.linear`` with the bias runs the add as the GEMM's epilogue.

:class:`FusedBiasColumnParallelLinear` and :class:`FusedBiasRowParallelLinear` take that path when the layer
needs no tensor-parallel communication (one tensor-parallel rank, no sequence parallelism, no gradient
accumulation fusion, no deferred embedding gradients, no CPU offloading) and return the bias as ``None`` since
it is already added (megatron's MLP and bias-dropout-add accept that). Otherwise they are megatron's layers.

Weight gradients: in training under megatron's DDP, the local path computes each weight's gradient straight into
the parameter's fp32 ``main_grad`` (one GEMM with fp32 accumulation, ``torch.addmm(..., out_dtype=torch.float32)``)
instead of writing a bf16 ``weight.grad`` that megatron's DDP hook then adds into ``main_grad`` with a separate
kernel: megatron's own ``gradient_accumulation_fusion`` contract (``grad_added_to_main_grad``, a dummy weight
gradient for autograd), which needs Apex or Transformer Engine. Without DDP (prediction, Lightning's strategies), on
CPUs, or on a torch without that GEMM, gradients flow through autograd into ``weight.grad`` as usual. It saves a
kernel and a bf16 gradient per weight on every backward, which makes the GPU recipe's step faster
(docs/benchmarks.md#training-throughput-as-a-share-of-peak). Switch: ``BIONEMO_WGRAD_INTO_MAIN_GRAD=0`` when the
model is built.
"""

import functools
import os
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

__all__ = [
    "FusedBiasColumnParallelLinear",
    "FusedBiasRowParallelLinear",
    "LinearIntoMainGrad",
    "accumulate_weight_gradient",
    "computes_locally",
    "into_main_grad",
]

WGRAD_SWITCH = "BIONEMO_WGRAD_INTO_MAIN_GRAD"


def wgrad_into_main_grad_enabled() -> bool:
    """Whether layers built now put weight gradients into ``main_grad`` (unless ``BIONEMO_WGRAD_INTO_MAIN_GRAD=0``)."""
    return os.environ.get(WGRAD_SWITCH, "1") != "0"


class LinearIntoMainGrad(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` whose backward adds the weight gradient into megatron DDP's ``weight.main_grad``.

    The backward follows megatron's fused-accumulation contract: it sets ``weight.grad_added_to_main_grad`` and
    returns an uninitialized weight gradient, so that autograd still runs DDP's hook on the parameter (which then
    skips the add and drops the tensor). Input and bias gradients are ordinary.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ weight.T + bias``, keeping ``x`` and ``weight`` for the backward."""
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(
        ctx: Any, *grad_outputs: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """Input and bias gradients; the weight's is added into ``weight.main_grad`` (a dummy is returned)."""
        (grad_output,) = grad_outputs
        x, weight = ctx.saved_tensors
        grad_input = grad_output.matmul(weight) if ctx.needs_input_grad[0] else None
        rows = grad_output.reshape(-1, grad_output.shape[-1])
        accumulate_weight_gradient(weight.main_grad, rows, x.reshape(-1, x.shape[-1]))
        weight.grad_added_to_main_grad = True
        grad_weight = torch.empty_like(weight)  # megatron's dummy: DDP's hook skips it (grad_added_to_main_grad)
        grad_bias = rows.sum(dim=0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_input, grad_weight, grad_bias


def accumulate_weight_gradient(main_grad: torch.Tensor, grad_output: torch.Tensor, x: torch.Tensor) -> None:
    """``main_grad += grad_output.T @ x`` for 2-D ``[tokens, out]`` / ``[tokens, in]``, accumulated in fp32."""
    if main_grad.is_cuda:
        torch.addmm(main_grad, grad_output.t(), x, out_dtype=torch.float32, out=main_grad)
    else:
        main_grad.add_(grad_output.t().matmul(x))  # what megatron DDP's hook adds from weight.grad


@functools.cache
def _fp32_accumulating_gemm() -> bool:
    """Whether this torch adds a bf16 GEMM into an fp32 tensor in place on CUDA (``addmm`` with ``out_dtype``)."""
    try:
        a = torch.full((8, 16), 0.5, dtype=torch.bfloat16, device="cuda")
        total = torch.ones(16, 16, device="cuda")
        accumulate_weight_gradient(total, a, a)  # 1 + 8 * 0.25 everywhere
        return bool((total == 3.0).all())
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def into_main_grad(weight: Any) -> bool:
    """Whether ``weight``'s gradient can go straight into its fp32 ``main_grad`` now (training under megatron DDP)."""
    return (
        torch.is_grad_enabled()
        and weight.requires_grad
        and getattr(weight, "main_grad", None) is not None
        and weight.main_grad.dtype == torch.float32
        and hasattr(weight, "grad_added_to_main_grad")
        and not getattr(weight, "zero_out_wgrad", False)
        and (not weight.is_cuda or _fp32_accumulating_gemm())
    )


def _linear(layer: Any, x: torch.Tensor) -> torch.Tensor:
    """``F.linear`` with the layer's weight and bias; weight gradients into ``main_grad`` where that applies."""
    if layer.wgrad_into_main_grad and into_main_grad(layer.weight):
        return LinearIntoMainGrad.apply(x, layer.weight, layer.bias)
    return F.linear(x, layer.weight, layer.bias)


def _local(layer: Any) -> bool:
    """Whether ``layer`` (a megatron parallel linear) needs no tensor-parallel communication or megatron extras."""
    config = layer.config
    group = getattr(layer, "tp_group", None)
    size = group.size() if group is not None else parallel_state.get_tensor_model_parallel_world_size()
    return (
        size == 1
        and not layer.sequence_parallel
        and not layer.gradient_accumulation_fusion
        and not getattr(layer, "explicit_expert_comm", False)
        and not config.defer_embedding_wgrad_compute
        and config._cpu_offloading_context is None
    )


class FusedBiasColumnParallelLinear(ColumnParallelLinear):
    """``ColumnParallelLinear`` whose bias is the GEMM's epilogue on one tensor-parallel rank (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wgrad_into_main_grad = wgrad_into_main_grad_enabled()

    def forward(  # type: ignore[override]
        self, input_: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output: bool | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(input @ weight.T + bias, None)`` when local, else megatron's ``(output, bias or None)``."""
        if weight is not None or self.weight is None or not _local(self):
            return super().forward(input_, weight, runtime_gather_output)
        return _linear(self, input_), None


class FusedBiasRowParallelLinear(RowParallelLinear):
    """``RowParallelLinear`` whose bias is the GEMM's epilogue on one tensor-parallel rank (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wgrad_into_main_grad = wgrad_into_main_grad_enabled()

    def forward(self, input_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:  # type: ignore[override]
        """``(input @ weight.T + bias, None)`` when local, else megatron's ``(output, bias or None)``."""
        if not _local(self):
            return super().forward(input_)
        return _linear(self, input_), None


def computes_locally(layer: torch.nn.Module) -> bool:
    """Whether ``layer(x)`` is ``(F.linear(x, layer.weight, layer.bias), None)`` now: a fused-bias layer, local."""
    return (
        isinstance(layer, FusedBiasColumnParallelLinear | FusedBiasRowParallelLinear)
        and layer.weight is not None
        and _local(layer)
    )
