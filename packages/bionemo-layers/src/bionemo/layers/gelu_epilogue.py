"""megatron-core's MLP whose first GEMM applies the bias and GELU in its epilogue when predicting on GPUs.

Without Transformer Engine, megatron-core 0.15.3's MLP runs GELU as its own kernel after the first linear layer: it
reads and writes the ``[tokens, ffn_hidden_size]`` activations once more, 9-11% of an ESM-2 prediction batch's GPU
time (docs/benchmarks.md#prediction-kernels). ``torch._addmm_activation(..., use_gelu=True)``
runs cuBLASLt's bias + GELU epilogue instead: GELU's tanh form (megatron's fused bias-GELU uses it too), computed on
the fp32 accumulator before the result is rounded to bf16 / fp16.

:class:`GeluEpilogueMLP` takes that path only in half-precision prediction: no gradient recorded (the
epilogue has no backward), CUDA, weights and inputs in bf16 or fp16, a first linear that computes locally
(:func:`bionemo.layers.fused_bias_linear.computes_locally`: one tensor-parallel rank, no LoRA adapter) with a bias,
exact GELU configured (``activation_func=F.gelu``, no GLU, no megatron fusion). The tanh form differs from the
exact (erf) GELU by less than 5e-4, below a bf16 rounding step of the activations it is applied to, and skipping
the rounding of the pre-activation makes the result closer to an fp64 reference than the two-kernel path (on an
H100, ESM-2 scaled inputs: largest error 8.0e-3 against 1.6e-2, mean 2.9e-4 against 4.2e-4). fp32 runs, training
and every other case are megatron's MLP unchanged, so fp32 parity with Hugging Face's exact GELU is untouched.

megatron-core's ``TransformerLayer`` passes its tensor-parallel group only to an MLP whose spec names ``MLP`` itself
(and warns about any other class), so :func:`bionemo.layers.sdpa_layer_spec` builds its layers as
:class:`EpilogueTransformerLayer`: megatron's layer, whose ``MLP`` (built by megatron, with its group) is then a
:class:`GeluEpilogueMLP` (a subclass that adds no state, only the forward above).

Switch: ``BIONEMO_GELU_EPILOGUE=0`` runs megatron's two kernels in prediction too.
"""

import os
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.transformer_layer import TransformerLayer

from bionemo.layers.fused_bias_linear import computes_locally

__all__ = ["SWITCH", "EpilogueTransformerLayer", "GeluEpilogueMLP", "gelu_epilogue_applies"]

SWITCH = "BIONEMO_GELU_EPILOGUE"


def gelu_epilogue_applies(mlp: MLP, hidden_states: torch.Tensor) -> bool:
    """Whether ``mlp``'s first GEMM applies bias and GELU in its epilogue for ``hidden_states`` (see the module)."""
    config = mlp.config
    fc1: Any = mlp.linear_fc1
    half = (torch.bfloat16, torch.float16)
    return (
        hidden_states.is_cuda
        and not torch.is_grad_enabled()
        and os.environ.get(SWITCH, "1") != "0"
        and hidden_states.dtype in half
        and mlp.activation_func is F.gelu
        and not config.gated_linear_unit
        and not config.bias_activation_fusion
        and not config.use_te_activation_func
        and computes_locally(fc1)
        and getattr(fc1, "bias", None) is not None
        and fc1.weight.dtype == hidden_states.dtype
    )


class GeluEpilogueMLP(MLP):
    """megatron-core's ``MLP`` (same arguments, weights and results' shapes); see the module for the GELU epilogue."""

    def forward(self, hidden_states: torch.Tensor, per_token_scale: Any = None):  # type: ignore[override]
        """``(output, output bias or None)`` as megatron's ``MLP.forward``."""
        if per_token_scale is not None or not gelu_epilogue_applies(self, hidden_states):
            return super().forward(hidden_states, per_token_scale)
        return self.linear_fc2(self._epilogue(hidden_states))

    def activations(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``GELU(hidden_states @ fc1.weight.T + fc1.bias)``: what the second linear layer takes, without a gradient.

        The epilogue where :func:`gelu_epilogue_applies`, else the first linear layer then its own GELU kernel (the
        arithmetic of megatron's MLP without GLU or fusions). For a caller that runs the second GEMM itself
        (:mod:`bionemo.layers.residual_gemm`).
        """
        if gelu_epilogue_applies(self, hidden_states):
            return self._epilogue(hidden_states)
        intermediate, bias = self.linear_fc1(hidden_states)
        if bias is not None:
            intermediate = intermediate + bias
        return self.activation_func(intermediate)

    def _epilogue(self, hidden_states: torch.Tensor) -> torch.Tensor:
        fc1: Any = self.linear_fc1
        rows = hidden_states.reshape(-1, hidden_states.shape[-1])
        intermediate = torch._addmm_activation(fc1.bias, rows, fc1.weight.t(), use_gelu=True)  # pyright: ignore[reportPrivateImportUsage]
        return intermediate.view(*hidden_states.shape[:-1], intermediate.shape[-1])


class EpilogueTransformerLayer(TransformerLayer):
    """megatron-core's ``TransformerLayer`` (same arguments); its ``MLP`` runs as :class:`GeluEpilogueMLP`.

    Only an MLP of exactly megatron's class is converted (a spec naming another MLP class keeps it).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if type(self.mlp) is MLP:
            self.mlp.__class__ = GeluEpilogueMLP
