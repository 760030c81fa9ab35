"""Model FLOPs of ESM-2 training: the matmuls a step does on its real tokens, for throughput as a share of peak.

Per sequence of ``L`` tokens (residues + 2) and per layer, the forward's matmuls are the QKV, output, and two MLP
projections, ``2 L (4 h^2 + 2 h ffn)``, and attention's two batched products, ``4 L^2 h``; the LM head adds
``2 L h V``. Training is 3 x the forward (the backward computes two gradients per matmul). Elementwise work
(LayerNorm, GELU, softmax, RoPE, the optimizer) is not counted, as in the usual model-FLOP utilisation. Padding is not
counted either: a padded batch does more work than this, for nothing.
"""

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["training_flops"]


def training_flops(model: Mapping[str, Any], vocab: int, lengths: Iterable[int]) -> float:
    """Matmul FLOPs of one training pass (forward and backward) over sequences of ``lengths`` tokens each.

    Args:
        model: The model settings: ``num_layers``, ``hidden_size``, ``ffn_hidden_size``.
        vocab: The LM head's output size.
        lengths: Each sequence's tokens (residues + 2).
    """
    h, ffn, layers = model["hidden_size"], model["ffn_hidden_size"], model["num_layers"]
    total = 0.0
    for tokens in lengths:
        per_layer = (8 * h * h + 4 * h * ffn) * tokens + 4 * tokens * tokens * h
        total += 3.0 * (layers * per_layer + 2 * h * vocab * tokens)
    return total
