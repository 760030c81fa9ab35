"""Helpers of the attention tests: ESM-2 style RoPE angles and one self-attention module of the local layer spec."""

from typing import Any

import torch


def angles(n: int, d: int, *shape: int) -> torch.Tensor:
    """ESM-2 style non-interleaved angles ``[n, *shape, d]`` (both halves equal), fp32."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(n, dtype=torch.float32), inv_freq)
    return torch.cat((freqs, freqs), dim=-1).reshape(n, *shape, d)


def self_attention(module_class: type, config) -> Any:
    """``sdpa_layer_spec``'s self-attention (bidirectional, padding mask) built as ``module_class``."""
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.spec_utils import build_module

    from bionemo.layers import sdpa_layer_spec

    spec = sdpa_layer_spec(AttnMaskType.padding).submodules.self_attention
    spec.module = module_class
    return build_module(spec, config=config, layer_number=1)
