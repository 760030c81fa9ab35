"""Old import path: the public names of :mod:`bionemo.layers.layer_norm`, where this module now lives."""

from bionemo.layers.layer_norm import (
    SWITCH,
    TritonLayerNorm,
    layer_norm_with_offset,
    local_layer_norm,
    triton_layer_norm_enabled,
)

__all__ = ["SWITCH", "TritonLayerNorm", "layer_norm_with_offset", "local_layer_norm", "triton_layer_norm_enabled"]
