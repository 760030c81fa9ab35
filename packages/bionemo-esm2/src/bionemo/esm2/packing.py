"""Padded ``[b, s]`` batches to unpadded ("thd") ones and back, for prediction without padding work."""

from collections.abc import Sequence

import torch

from bionemo.lightning import UnpaddedSequences

__all__ = ["repad", "unpad"]


def unpad(
    tokens: torch.Tensor, host_lengths: torch.Tensor | Sequence[int]
) -> tuple[torch.Tensor, UnpaddedSequences, torch.Tensor]:
    """Concatenate the real tokens of right-padded ``tokens [b, s]``: ``(ids [1, T], sequences, index [T])``.

    ``host_lengths`` (tokens per row, on the host) plans everything without waiting for the device; ``index``
    holds each token's position in the flattened ``[b * s]`` batch, for :func:`repad`.
    """
    lengths = torch.as_tensor(host_lengths, dtype=torch.int64).cpu()
    boundaries = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=boundaries[1:])
    sequence_ids = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    positions = torch.arange(int(boundaries[-1])) - boundaries[:-1][sequence_ids]
    index = sequence_ids * tokens.shape[1] + positions
    device = tokens.device
    sequences = UnpaddedSequences(
        boundaries=boundaries.to(torch.int32).to(device, non_blocking=True),
        longest=int(lengths.max()),
        sequence_ids=sequence_ids.to(device, non_blocking=True),
        positions=positions.to(device, non_blocking=True),
    )
    index = index.to(device, non_blocking=True)
    return tokens.reshape(-1)[index].unsqueeze(0), sequences, index


def repad(states: torch.Tensor, index: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """Unpadded ``[T, 1, ...]`` outputs back to megatron's padded ``[s, b, ...]`` layout, zeros at padding."""
    flat = states.reshape(states.shape[0], *states.shape[2:])
    out = flat.new_zeros(batch * length, *flat.shape[1:])
    out[index] = flat
    return out.view(batch, length, *flat.shape[1:]).transpose(0, 1)
