"""The token budget of a prediction batch when the user gives neither ``--tokens-per-batch`` nor ``--micro-batch-size``.

Prediction batches length-sorted sequences up to a number of tokens (padding included): large batches keep a GPU
busy, and a budget in tokens keeps the memory a batch needs the same whatever its sequences' lengths. The default
is sized from the model and the device's total memory, never its free memory: every data-parallel rank must plan
the same batches, and free memory differs between ranks and runs. Only the standard library is used.
"""

from collections.abc import Collection, Mapping
from typing import Any

__all__ = [
    "CPU_TOKENS_PER_BATCH",
    "GPU_TOKENS_PER_BATCH",
    "MEMORY_SHARE",
    "default_tokens_per_batch",
    "device_bytes_per_token",
]

GPU_TOKENS_PER_BATCH = 131_072
"""The largest default budget on a GPU: larger batches no longer shorten the run (the GPU is already kept busy),
they only hold more outputs in memory."""

CPU_TOKENS_PER_BATCH = 8_192
"""The default budget on CPUs, where a batch's size barely changes the speed and memory is not the limit."""

MEMORY_SHARE = 0.25
"""Share of the device's total memory a batch's activations and outputs may take: the rest holds the weights, the
allocator's fragmentation and what other processes on the device use."""


def device_bytes_per_token(
    model: Mapping[str, Any], includes: Collection[str], *, activation_bytes: int = 2, output_bytes: int = 4
) -> int:
    """Bytes of device memory one token of a batch needs at the peak of a prediction forward pass (an upper bound).

    Without gradients each layer's activations are freed after the next layer ran, so the peak is one layer's:
    the residual stream, LayerNorm output, fused q/k/v, attention output and projection (``7 h``), the MLP's two
    ``ffn``-wide tensors, all in the parameters' type (``activation_bytes``), plus what the step keeps on the
    device for every token until the batch ends: ``residue-embeddings`` (``h`` per token and per extra layer) and
    ``logits`` (33) in ``output_bytes``, and the last hidden states (float32, for the means).
    """
    h = int(model["hidden_size"])
    ffn = int(model.get("ffn_hidden_size") or 4 * h)
    per_token = (7 * h + 2 * ffn) * activation_bytes + 4 * h
    if "residue-embeddings" in includes:
        per_token += h * output_bytes
    if "logits" in includes:
        per_token += 33 * (output_bytes + 4)
    return per_token


def default_tokens_per_batch(
    model: Mapping[str, Any],
    includes: Collection[str],
    *,
    device_memory: int | None,
    longest: int,
    output_bytes: int = 4,
) -> int:
    """The default token budget of a prediction batch.

    :data:`CPU_TOKENS_PER_BATCH` on CPUs (``device_memory=None``), else what :data:`MEMORY_SHARE` of the GPU's
    ``device_memory`` (bytes) holds at :func:`device_bytes_per_token`, at most :data:`GPU_TOKENS_PER_BATCH`; never
    below ``longest`` (the longest sequence's tokens), which must fit alone.
    """
    if device_memory is None:
        return max(CPU_TOKENS_PER_BATCH, longest)
    per_token = device_bytes_per_token(model, includes, output_bytes=output_bytes)
    fitting = int(device_memory * MEMORY_SHARE) // per_token
    return max(longest, min(GPU_TOKENS_PER_BATCH, fitting))
