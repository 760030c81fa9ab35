"""Old import path: the public names of :mod:`bionemo.layers.rotary`, where this module now lives."""

from bionemo.layers.rotary import RotarySelfAttention, apply_rotary, fused_rotary_available, rotary_tables

__all__ = ["RotarySelfAttention", "apply_rotary", "fused_rotary_available", "rotary_tables"]
