"""The merged prediction file: tensors in input order plus the sequence ids, as safetensors."""

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from bionemo.callbacks import save_safetensors_atomically

__all__ = ["read_predictions", "split_residues", "write_predictions"]


def write_predictions(
    path: Path, tensors: Mapping[str, torch.Tensor], ids: Sequence[str], metadata: Mapping[str, Any]
) -> Path:
    """Write ``tensors`` (row ``i`` = input sequence ``i``) with ``ids`` in the metadata, atomically.

    Raises:
        ValueError: When the tensors do not hold one row per id, in input order.
    """
    index = tensors["sample_index"].tolist()
    if index != list(range(len(ids))):
        raise ValueError(f"predictions cover samples {index[:5]}... but there are {len(ids)} inputs; rows are missing")
    return save_safetensors_atomically(
        tensors, path, {"ids": json.dumps(list(ids)), **{key: json.dumps(value) for key, value in metadata.items()}}
    )


def read_predictions(path: Path) -> tuple[list[str], dict[str, torch.Tensor]]:
    """The sequence ids and tensors of a predictions file (no pickle involved).

    Row ``i`` of every per-sequence tensor (``embeddings``, ``cls``, ``logits``, ``perplexity``) belongs to
    ``ids[i]``; per-residue tensors are split per sequence by :func:`split_residues`.
    """
    with safe_open(str(path), framework="pt") as f:
        ids = json.loads((f.metadata() or {})["ids"])
        return ids, {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118


def split_residues(tensors: Mapping[str, torch.Tensor], key: str = "residue_embeddings") -> list[torch.Tensor]:
    """Per-sequence ``[length, h]`` views of a flattened per-residue tensor (``residue_offsets`` marks the rows)."""
    offsets = tensors["residue_offsets"].tolist()
    return [tensors[key][start:end] for start, end in zip(offsets[:-1], offsets[1:], strict=True)]
