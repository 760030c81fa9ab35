"""megatron-core's parallel linear layers with the bias added inside the matrix multiply, without tensor parallelism.

Without Transformer Engine, megatron-core 0.15.3's ``ColumnParallelLinear`` / ``RowParallelLinear`` multiply
(``torch.matmul``) and add the bias as a separate broadcasting kernel, either at once or later in the layer's
bias-dropout-add (``skip_bias_add``). Four such adds per transformer layer were 28% of the GPU time of an ESM-2
150M prediction batch and 26% at 650M on an H200 (``tools/profile_predict.py``, 64k tokens; 231 and 487 us per
add). ``torch.nn.functional.linear`` with the bias runs the add as the GEMM's epilogue.

:class:`FusedBiasColumnParallelLinear` and :class:`FusedBiasRowParallelLinear` take that path when the layer
needs no tensor-parallel communication (one tensor-parallel rank, no sequence parallelism, no gradient
accumulation fusion, no deferred embedding gradients, no CPU offloading) and return the bias as ``None`` since
it is already added (megatron's MLP and bias-dropout-add accept that). Otherwise they are megatron's layers.
Weight gradients flow through autograd into ``weight.grad``, which megatron's DDP hooks accumulate as usual.
"""

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

__all__ = ["FusedBiasColumnParallelLinear", "FusedBiasRowParallelLinear"]


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

    def forward(  # type: ignore[override]
        self, input_: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output: bool | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(input @ weight.T + bias, None)`` when local, else megatron's ``(output, bias or None)``."""
        if weight is not None or self.weight is None or not _local(self):
            return super().forward(input_, weight, runtime_gather_output)
        return F.linear(input_, self.weight, self.bias), None


class FusedBiasRowParallelLinear(RowParallelLinear):
    """``RowParallelLinear`` whose bias is the GEMM's epilogue on one tensor-parallel rank (see the module)."""

    def forward(self, input_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:  # type: ignore[override]
        """``(input @ weight.T + bias, None)`` when local, else megatron's ``(output, bias or None)``."""
        if not _local(self):
            return super().forward(input_)
        return F.linear(input_, self.weight, self.bias), None
