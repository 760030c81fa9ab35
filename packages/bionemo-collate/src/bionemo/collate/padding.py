"""Concatenate same-rank tensors along a batch dimension, right-padding a ragged sequence dimension.

This is the leaf operation of :func:`bionemo.collate.batch_collator`. It allocates the output once and
writes every output element exactly once: the inputs are copied into their slices and only the padding
tail of each slice is filled, so there is no pad-then-concatenate double copy.
"""

from collections.abc import Mapping, Sequence

import torch

__all__ = [
    "DEFAULT_BATCH_DIMS",
    "DEFAULT_PAD_VALUES",
    "DEFAULT_SEQ_DIMS",
    "concat_padded",
]

DEFAULT_BATCH_DIMS: Mapping[str, int] = {"token_logits": 1}
"""Keys whose batch dimension is not 0: megatron's ``token_logits`` are sequence-first, ``[s, b, v]``."""

DEFAULT_SEQ_DIMS: Mapping[str, int] = {"token_logits": 0}
"""Keys whose sequence dimension is not 1 (``token_logits [s, b, v]`` has it first)."""

DEFAULT_PAD_VALUES: Mapping[str, float] = {
    "labels": -100,
    "loss_mask": 0,
    "attention_mask": 0,
    "token_logits": 0,
}
"""Right-padding values by key; ``-100`` is the ignore index of ``torch.nn.functional.cross_entropy``."""


def concat_padded(
    tensors: Sequence[torch.Tensor],
    *,
    batch_dim: int,
    seq_dim: int | None,
    pad_value: float = 0,
    device: torch.device | str | None = None,
    name: str = "tensor",
) -> torch.Tensor:
    """Concatenate ``tensors`` along ``batch_dim``, right-padding ``seq_dim`` to the longest input.

    Args:
        tensors: At least one tensor; all of the same rank. Sizes may differ along ``batch_dim`` and, when
            ``seq_dim`` is given and exists in the tensors, along ``seq_dim``; every other size must agree.
        batch_dim: Dimension to concatenate along (negative values count from the end).
        seq_dim: Dimension to right-pad to the longest input, or ``None`` for none. A ``seq_dim`` beyond the
            tensors' rank is ignored, so one setting serves ``[b, s]`` tokens and ``[b]`` scores alike.
        pad_value: Value written into the padding.
        device: Device of the result; defaults to the device of the first tensor.
        name: How error messages refer to this leaf (e.g. ``'["token_logits"]'``).

    Returns:
        One tensor of dtype ``torch.result_type`` over the inputs (the same as ``torch.cat``).

    Raises:
        ValueError: Tensors of different rank, or sizes differing along a dimension that is neither
            the batch nor the sequence dimension.
    """
    first = tensors[0]
    ndim = first.dim()
    if ndim == 0:
        raise ValueError(f"Cannot concatenate 0-dimensional tensors at {name}: outputs need a batch dimension")
    batch_dim = _normalize_dim(batch_dim, ndim, name, "batch_dim")
    if seq_dim is not None:
        seq_dim = seq_dim + ndim if seq_dim < 0 else seq_dim
        if seq_dim >= ndim or seq_dim == batch_dim:
            seq_dim = None
    out_device = torch.device(device) if device is not None else first.device

    out_shape = list(first.shape)
    out_shape[batch_dim] = 0
    dtype = first.dtype
    ragged = False
    for index, tensor in enumerate(tensors):
        if tensor.dim() != ndim:
            raise ValueError(f"Cannot collate {name}: batch {index} has {tensor.dim()} dimensions, batch 0 has {ndim}")
        for dim, size in enumerate(tensor.shape):
            if dim == batch_dim:
                out_shape[dim] += size
            elif dim == seq_dim:
                ragged = ragged or size != out_shape[dim]
                out_shape[dim] = max(out_shape[dim], size)
            elif size != out_shape[dim]:
                raise ValueError(
                    f"Cannot collate {name}: batch {index} has size {size} in dimension {dim}, batch 0 has "
                    f"{out_shape[dim]}; only the batch dimension ({batch_dim}) and the sequence dimension "
                    f"({seq_dim}) may differ"
                )
        dtype = torch.promote_types(dtype, tensor.dtype)

    if not ragged and all(t.device == out_device and t.dtype == dtype for t in tensors):
        return torch.cat(list(tensors), dim=batch_dim)

    out = torch.empty(out_shape, dtype=dtype, device=out_device)
    offset = 0
    for tensor in tensors:
        rows = out.narrow(batch_dim, offset, tensor.shape[batch_dim])
        offset += tensor.shape[batch_dim]
        if seq_dim is None:
            rows.copy_(tensor)
            continue
        length = tensor.shape[seq_dim]
        rows.narrow(seq_dim, 0, length).copy_(tensor)
        if length < out_shape[seq_dim]:
            rows.narrow(seq_dim, length, out_shape[seq_dim] - length).fill_(pad_value)
    return out


def _normalize_dim(dim: int, ndim: int, name: str, what: str) -> int:
    if not -ndim <= dim < ndim:
        raise ValueError(f"{what}={dim} is out of range for the {ndim}-dimensional tensors at {name}")
    return dim + ndim if dim < 0 else dim
