"""Small helpers every package uses: first non-None item, dtype and device of tensors and modules."""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import torch

__all__ = ["get_dtype_device", "some_first"]

T = TypeVar("T")


def some_first(seq: Iterable[T | None]) -> T:
    """Return the first item of ``seq`` that is not ``None``.

    Raises:
        ValueError: ``"non-None value not found"`` when every item is ``None`` or ``seq`` is empty.
    """
    for item in seq:
        if item is not None:
            return item
    raise ValueError("non-None value not found")


def get_dtype_device(
    obj: torch.Tensor | torch.nn.Module | Sequence[Any] | Mapping[Any, Any],
) -> tuple[torch.dtype, torch.device]:
    """Return ``(dtype, device)`` of a tensor, a module, or the first non-None value of a list/tuple/dict.

    A module answers with its first parameter; containers are searched depth-first. The error texts are
    bionemo-llm's, word for word: code written against the old module matches on them.

    Raises:
        ValueError: ``"Looking up dtype on an empty list"`` / ``"... empty dict"``, ``"non-None value not
            found"`` (only ``None`` inside), ``"Cannot get dtype on a torch module with no parameters."``.
        TypeError: ``"Got something we didnt expect"`` for anything else (a string, a number, ...).
    """
    if isinstance(obj, torch.Tensor):
        return obj.dtype, obj.device
    if isinstance(obj, torch.nn.Module):
        try:
            param = next(obj.parameters())
        except StopIteration:
            raise ValueError("Cannot get dtype on a torch module with no parameters.") from None
        return param.dtype, param.device
    if isinstance(obj, Mapping):
        if not obj:
            raise ValueError("Looking up dtype on an empty dict")
        return get_dtype_device(some_first(obj.values()))
    if isinstance(obj, Sequence) and not isinstance(obj, str | bytes):
        if not obj:
            raise ValueError("Looking up dtype on an empty list")
        return get_dtype_device(some_first(obj))
    raise TypeError("Got something we didnt expect")
