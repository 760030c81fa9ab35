"""Old import path: the public names of :mod:`bionemo.layers.fused_bias_linear`, where this module now lives."""

from bionemo.layers.fused_bias_linear import (
    WGRAD_SWITCH,
    FusedBiasColumnParallelLinear,
    FusedBiasRowParallelLinear,
    LinearIntoMainGrad,
    accumulate_weight_gradient,
    computes_locally,
    into_main_grad,
    wgrad_into_main_grad_enabled,
)

__all__ = [
    "FusedBiasColumnParallelLinear",
    "FusedBiasRowParallelLinear",
    "LinearIntoMainGrad",
    "WGRAD_SWITCH",
    "accumulate_weight_gradient",
    "computes_locally",
    "into_main_grad",
    "wgrad_into_main_grad_enabled",
]
