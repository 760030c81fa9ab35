"""Collate already-batched model outputs (micro-batches, ranks) into one batch of the same structure."""

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from bionemo.collate.padding import DEFAULT_BATCH_DIMS, DEFAULT_PAD_VALUES, DEFAULT_SEQ_DIMS, concat_padded

__all__ = ["batch_collator"]


def batch_collator(
    batches: Sequence[Any],
    batch_dim: int = 0,
    seq_dim: int | None = 1,
    batch_dim_key_defaults: Mapping[str, int] | None = None,
    seq_dim_key_defaults: Mapping[str, int] | None = None,
    pad_value: float = 0,
    pad_value_key_defaults: Mapping[str, float] | None = None,
    device: torch.device | str | None = None,
) -> Any:
    """Collate a sequence of batches, each already holding a batch dimension, into one batch.

    Unlike ``torch.utils.data.default_collate`` this adds no dimension: it concatenates along the existing
    batch dimension, as needed to join the outputs of several micro-batches or data-parallel ranks.

    Each batch is a tensor, ``None``, or a dict / tuple / list of them nested to any depth; all batches
    share one structure and the result has it too (same container types, same keys). A leaf where the
    first batch holds ``None`` collates to ``None``.

    Tensors whose sequence lengths differ are right-padded to the longest before joining; the output is
    allocated once and each element written once.

    Args:
        batches: The batches to collate, in order (a list or tuple).
        batch_dim: Batch dimension of tensors whose dict key has no entry in ``batch_dim_key_defaults``.
        seq_dim: Sequence dimension (padded when ragged) of tensors whose key has no entry in
            ``seq_dim_key_defaults``; ``None`` to never pad. Ignored for tensors with fewer dimensions.
        batch_dim_key_defaults: Batch dimension per dict key, applying to everything under that key.
            ``None`` means ``{"token_logits": 1}`` (megatron logits are ``[s, b, v]``).
        seq_dim_key_defaults: Sequence dimension per dict key. ``None`` means ``{"token_logits": 0}``.
        pad_value: Padding value of tensors whose key has no entry in ``pad_value_key_defaults``.
        pad_value_key_defaults: Padding value per dict key. ``None`` means ``labels`` pad with -100 and
            ``loss_mask``, ``attention_mask`` and ``token_logits`` with 0.
        device: Device every collated tensor lands on; ``None`` keeps the device of each leaf's first
            tensor. Tensors from other devices are copied there.

    Returns:
        One batch with the structure of ``batches[0]``.

    Raises:
        ValueError: ``"Cannot process an empty sequence"`` for no batches; ``"Unsupported input structure
            in batch_collator"`` when ``batches`` is not a list/tuple (a set, dict, tensor or scalar) or a
            leaf is not a tensor; a message naming the key or index where batches disagree in structure
            or in a size other than the batch and sequence dimensions.
    """
    if not isinstance(batches, list | tuple):
        raise ValueError("Unsupported input structure in batch_collator")
    if not batches:
        raise ValueError("Cannot process an empty sequence")
    collator = _Collator(
        batch_dims={**DEFAULT_BATCH_DIMS} if batch_dim_key_defaults is None else batch_dim_key_defaults,
        seq_dims={**DEFAULT_SEQ_DIMS} if seq_dim_key_defaults is None else seq_dim_key_defaults,
        pad_values={**DEFAULT_PAD_VALUES} if pad_value_key_defaults is None else pad_value_key_defaults,
        device=device,
    )
    return collator.collate(batches, path="batch", batch_dim=batch_dim, seq_dim=seq_dim, pad_value=pad_value)


class _Collator:
    """Walks the nested structure; per-key settings flow down to everything below that key."""

    def __init__(
        self,
        *,
        batch_dims: Mapping[str, int],
        seq_dims: Mapping[str, int],
        pad_values: Mapping[str, float],
        device: torch.device | str | None,
    ) -> None:
        self.batch_dims = batch_dims
        self.seq_dims = seq_dims
        self.pad_values = pad_values
        self.device = device

    def collate(
        self, batches: Sequence[Any], *, path: str, batch_dim: int, seq_dim: int | None, pad_value: float
    ) -> Any:
        first = batches[0]
        if first is None:
            _require_all(batches, lambda b: b is None, path, "None")
            return None
        if isinstance(first, torch.Tensor):
            _require_all(batches, lambda b: isinstance(b, torch.Tensor), path, "a tensor")
            return concat_padded(
                batches,
                batch_dim=batch_dim,
                seq_dim=seq_dim,
                pad_value=pad_value,
                device=self.device,
                name=path,
            )
        if isinstance(first, Mapping):
            _require_all(batches, lambda b: isinstance(b, Mapping), path, "a dict")
            keys = list(first.keys())
            for index, batch in enumerate(batches[1:], start=1):
                if batch.keys() != first.keys():
                    missing = sorted(map(str, first.keys() - batch.keys()))
                    extra = sorted(map(str, batch.keys() - first.keys()))
                    raise ValueError(
                        f"Cannot collate {path}: batch {index} has different keys than batch 0 "
                        f"(missing {missing}, extra {extra})"
                    )
            mapping_type: Any = type(first)
            return mapping_type(
                {
                    key: self.collate(
                        [batch[key] for batch in batches],
                        path=f"{path}[{key!r}]",
                        batch_dim=self.batch_dims.get(key, batch_dim),
                        seq_dim=self.seq_dims.get(key, seq_dim),
                        pad_value=self.pad_values.get(key, pad_value),
                    )
                    for key in keys
                }
            )
        if isinstance(first, list | tuple):
            container = type(first)
            _require_all(batches, lambda b: type(b) is container, path, f"a {container.__name__}")
            for index, batch in enumerate(batches[1:], start=1):
                if len(batch) != len(first):
                    raise ValueError(
                        f"Cannot collate {path}: batch {index} has {len(batch)} items, batch 0 has {len(first)}"
                    )
            items = [
                self.collate(
                    [batch[i] for batch in batches],
                    path=f"{path}[{i}]",
                    batch_dim=batch_dim,
                    seq_dim=seq_dim,
                    pad_value=pad_value,
                )
                for i in range(len(first))
            ]
            return container(items) if container in (list, tuple) else container(*items)
        raise ValueError(
            f"Unsupported input structure in batch_collator: {type(first).__name__} at {path}; "
            "expected a tensor, None, or a dict/tuple/list of them"
        )


def _require_all(batches: Sequence[Any], check: Any, path: str, what: str) -> None:
    for index, batch in enumerate(batches):
        if not check(batch):
            raise ValueError(
                f"Cannot collate {path}: batch 0 holds {what} but batch {index} holds {type(batch).__name__}"
            )
