"""Padded ``[b, s]`` batches to unpadded ("thd") ones and back, for prediction without padding work."""

from collections.abc import Sequence

import torch

from bionemo.layers import UnpaddedSequences

__all__ = ["repad", "unpad"]


def unpad(
    tokens: torch.Tensor, host_lengths: torch.Tensor | Sequence[int]
) -> tuple[torch.Tensor, UnpaddedSequences, torch.Tensor]:
    """Concatenate the real tokens of right-padded ``tokens [b, s]``: ``(ids [1, T], sequences, index [T])``.

    ``host_lengths`` (tokens per row, on the host) gives the sizes without waiting for the device; the per-token
    tensors are computed on ``tokens``' device (on the host they cost milliseconds per batch:
    docs/benchmarks.md#prediction-loop). ``index`` holds each token's position in the flattened ``[b * s]`` batch,
    for :func:`repad`.
    """
    lengths = torch.as_tensor(host_lengths, dtype=torch.int64).cpu()
    device = tokens.device
    batch, length = tokens.shape
    total = int(lengths.sum())
    on_device = lengths.to(device, non_blocking=True)
    boundaries = torch.zeros(batch + 1, dtype=torch.int64, device=device)
    torch.cumsum(on_device, 0, out=boundaries[1:])
    sequence_ids = torch.repeat_interleave(torch.arange(batch, device=device), on_device, output_size=total)
    positions = torch.arange(total, device=device) - boundaries[:-1][sequence_ids]
    index = sequence_ids * length + positions
    sequences = UnpaddedSequences(
        boundaries=boundaries.to(torch.int32),
        longest=int(lengths.max()),
        sequence_ids=sequence_ids,
        positions=positions,
    )
    return tokens.reshape(-1)[index].unsqueeze(0), sequences, index


def repad(states: torch.Tensor, index: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """Unpadded ``[T, 1, ...]`` outputs back to megatron's padded ``[s, b, ...]`` layout, zeros at padding."""
    flat = states.reshape(states.shape[0], *states.shape[2:])
    out = flat.new_zeros(batch * length, *flat.shape[1:])
    out[index] = flat
    return out.view(batch, length, *flat.shape[1:]).transpose(0, 1)
