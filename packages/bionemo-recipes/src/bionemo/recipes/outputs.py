"""The merged prediction file: tensors in input order plus the sequence ids, as safetensors.

:func:`assemble_predictions` streams prediction shards into that file one shard at a time, so host memory does
not grow with the number of sequences; the file is ordinary safetensors, and ``safetensors.safe_open`` reads any
row range of it without loading the rest.
"""

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from bionemo.core.atomic_files import replaced_atomically
from bionemo.core.safetensors_header import TORCH_DTYPE_NAMES

__all__ = ["assemble_predictions", "read_predictions", "split_contacts", "split_residues"]

_SAFETENSORS_NAMES = {getattr(torch, name): code for code, name in TORCH_DTYPE_NAMES.items()}
"""The safetensors name (a header's ``dtype``) of each torch type."""


def read_predictions(path: Path) -> tuple[list[str], dict[str, torch.Tensor]]:
    """The sequence ids and tensors of a predictions file (no pickle involved).

    Row ``i`` of every per-sequence tensor (``embeddings``, ``cls``, ``logits``, ``perplexity``) belongs to
    ``ids[i]``; per-residue tensors are split per sequence by :func:`split_residues`, contacts by
    :func:`split_contacts`.
    """
    with safe_open(str(path), framework="pt") as f:
        ids = json.loads((f.metadata() or {})["ids"])
        return ids, {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118


def split_residues(tensors: Mapping[str, torch.Tensor], key: str = "residue_embeddings") -> list[torch.Tensor]:
    """Per-sequence ``[length, h]`` views of a flattened per-residue tensor (``residue_offsets`` marks the rows)."""
    offsets = tensors["residue_offsets"].tolist()
    return [tensors[key][start:end] for start, end in zip(offsets[:-1], offsets[1:], strict=True)]


def split_contacts(tensors: Mapping[str, torch.Tensor], key: str = "contacts") -> list[torch.Tensor]:
    """Per-sequence ``[L, L]`` views of a flattened per-residue-pair tensor (``contact_offsets`` marks its parts).

    Sequence ``i``'s residue pairs are ``contacts[contact_offsets[i]:contact_offsets[i + 1]]``, ``L_i^2`` values
    row-major: entry ``(j, k)`` is residues ``j`` and ``k`` (0-based, no ``<cls>``).
    """
    offsets = tensors["contact_offsets"].tolist()
    parts = []
    for start, end in zip(offsets[:-1], offsets[1:], strict=True):
        length = math.isqrt(end - start)
        parts.append(tensors[key][start:end].view(length, length))
    return parts


def assemble_predictions(
    path: Path,
    shards: Sequence[Path],
    lengths: Sequence[int],
    ids: Sequence[str],
    metadata: Mapping[str, Any],
    *,
    is_residue_key: Callable[[str], bool] = lambda key: key.startswith("residue_embeddings"),
    is_pair_key: Callable[[str], bool] = lambda key: key == "contacts",
    index_key: str = "sample_index",
) -> Path:
    """Write prediction ``shards`` into one safetensors file at ``path`` in input order, one shard in memory at a time.

    Each shard holds ``index_key`` (``[b]`` input positions) and per-sequence tensors ``[b, ...]``. Per-residue
    tensors (``is_residue_key``; ``[b, s, h]``, zero-padded) are written flat as ``[sum of lengths, h]`` with
    ``residue_offsets [n + 1]`` (sequence ``i`` is rows ``offsets[i]:offsets[i + 1]``); others as ``[n, ...]``,
    a ragged second dimension (logits ``[b, s, v]``) zero-padded to the longest shard's. Per-residue-pair tensors
    (``is_pair_key``; ``[b, m]``, row ``i`` starting with sequence ``i``'s ``L_i^2`` values) are written flat as
    ``[sum of L_i^2]`` with ``contact_offsets [n + 1]``. A sample found in more than one shard is written once.
    ``ids`` and ``metadata`` go into the file's metadata, ``index_key`` holds ``0..n-1``. The file appears
    complete under ``path`` or not at all.

    Raises:
        ValueError: A shard disagrees with another on a tensor's type or shape, or some input is in no shard.
    """
    n = len(lengths)
    offsets = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
    pair_offsets = torch.tensor([0, *(length * length for length in lengths)], dtype=torch.int64).cumsum(0)
    layout = _layout(shards, n, int(offsets[-1]), is_residue_key, index_key, (int(pair_offsets[-1]), is_pair_key))
    fixed = {index_key: torch.arange(n, dtype=torch.int64)}
    if any(is_residue_key(key) for key in layout):
        fixed["residue_offsets"] = offsets
    if any(is_pair_key(key) for key in layout):
        fixed["contact_offsets"] = pair_offsets
    for key, value in fixed.items():
        layout[key] = (value.dtype, tuple(value.shape))
    header, data_start, starts = _header(layout, {"ids": json.dumps(list(ids)), **metadata})
    with replaced_atomically(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY)
        try:
            os.write(fd, header)
            total = data_start + sum(_nbytes(dtype, shape) for dtype, shape in layout.values())
            os.ftruncate(fd, total)  # zeros: the padding of ragged rows
            for key, value in fixed.items():
                os.pwrite(fd, _bytes(value), data_start + starts[key])
            written = torch.zeros(n, dtype=torch.bool)
            flat = [key for key in layout if is_residue_key(key) or is_pair_key(key)]
            ragged = {key: offsets if is_residue_key(key) else pair_offsets for key in flat}
            for shard in shards:
                _write_shard(fd, shard, layout, data_start, starts, ragged, written, index_key)
        finally:
            os.close(fd)
        if not bool(written.all()):
            missing = torch.nonzero(~written).flatten()[:5].tolist()
            raise ValueError(f"{int((~written).sum())} of {n} inputs are in no prediction shard (e.g. rows {missing})")
    return path


def _layout(
    shards: Sequence[Path],
    n: int,
    residues: int,
    is_residue_key: Callable[[str], bool],
    index_key: str,
    pairs: tuple[int, Callable[[str], bool]],
) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Each output tensor's type and full shape, from the shards' headers (no tensor data is read).

    ``pairs``: the residue pairs of all sequences and which keys hold per-pair values (flat ``[pairs]``).
    """
    found: dict[str, tuple[torch.dtype, list[int]]] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if key == index_key:
                    continue
                piece = f.get_slice(key)
                dtype = getattr(torch, TORCH_DTYPE_NAMES[piece.get_dtype()])
                shape = list(piece.get_shape())
                if key not in found:
                    found[key] = (dtype, shape)
                    continue
                known_dtype, known = found[key]
                if known_dtype != dtype or len(known) != len(shape) or known[2:] != shape[2:]:
                    raise ValueError(
                        f"prediction shard {shard.name}: {key} is {dtype} {shape[1:]} per row, other shards "
                        f"{known_dtype} {known[1:]}; shards of one prediction must agree"
                    )
                if len(shape) > 1:
                    known[1] = max(known[1], shape[1])
    layout: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    pair_count, is_pair_key = pairs
    for key, (dtype, shape) in found.items():
        if is_residue_key(key):
            layout[key] = (dtype, (residues, *shape[2:]))
        elif is_pair_key(key):
            if len(shape) != 2:
                raise ValueError(f"prediction shards: {key} is {shape}, per-residue-pair values are [b, pairs]")
            layout[key] = (dtype, (pair_count,))
        else:
            layout[key] = (dtype, (n, *shape[1:]))
    return layout


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _header(
    layout: Mapping[str, tuple[torch.dtype, tuple[int, ...]]], metadata: Mapping[str, Any]
) -> tuple[bytes, int, dict[str, int]]:
    """The safetensors header (8-byte length + JSON, padded to 8 bytes), where data starts, each tensor's start."""
    entries: dict[str, Any] = {"__metadata__": {key: str(value) for key, value in metadata.items()}}
    starts, position = {}, 0
    for key in sorted(layout):
        dtype, shape = layout[key]
        size = _nbytes(dtype, shape)
        entries[key] = {
            "dtype": _SAFETENSORS_NAMES[dtype],
            "shape": list(shape),
            "data_offsets": [position, position + size],
        }
        starts[key] = position
        position += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, 8 + len(text), starts


def _bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _write_shard(
    fd: int,
    shard: Path,
    layout: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
    data_start: int,
    starts: Mapping[str, int],
    ragged: Mapping[str, torch.Tensor],
    written: torch.Tensor,
    index_key: str,
) -> None:
    """Write each not-yet-written sample of ``shard`` at its rows of every tensor.

    ``ragged``: the flattened tensors (per residue, per residue pair) and the offsets of each sample's rows.
    """
    with safe_open(str(shard), framework="pt") as f:
        index = f.get_tensor(index_key).long().flatten()
        fresh = [row for row, sample in enumerate(index.tolist()) if not written[sample]]
        if not fresh:
            return
        for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            if key == index_key:
                continue
            value = f.get_tensor(key)
            dtype, shape = layout[key]
            row_bytes = _nbytes(dtype, shape[1:])
            for row in fresh:
                sample = int(index[row])
                if key in ragged:
                    offsets = ragged[key]
                    count = int(offsets[sample + 1] - offsets[sample])
                    where = int(offsets[sample]) * row_bytes
                    os.pwrite(fd, _bytes(value[row, :count]), data_start + starts[key] + where)
                else:
                    os.pwrite(fd, _bytes(value[row]), data_start + starts[key] + sample * row_bytes)
    written[index[fresh]] = True
