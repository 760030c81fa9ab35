"""Old import path: the public names of :mod:`bionemo.layers.sdpa_attention`, where this module now lives."""

from bionemo.layers.sdpa_attention import (
    MASKED_BACKENDS,
    SDPACoreAttention,
    UnpaddedSequences,
    sdpa_layer_spec,
    varlen_attention_available,
)

__all__ = ["MASKED_BACKENDS", "SDPACoreAttention", "UnpaddedSequences", "sdpa_layer_spec", "varlen_attention_available"]
