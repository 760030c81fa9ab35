"""The header of a safetensors file (tensor names, types, shapes and metadata), read with the standard library.

A safetensors file is an 8-byte little-endian header length, a JSON header and the tensor data. Reading the
header needs neither torch nor numpy, so a command can refuse a damaged or truncated file before it imports
them. The checks are the structural ones; a file that passes may still be refused when its tensors are read.
"""

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

__all__ = [
    "FLOATING_POINT_DTYPES",
    "TORCH_DTYPE_NAMES",
    "SafetensorsHeader",
    "SafetensorsHeaderError",
    "TensorEntry",
    "read_safetensors_header",
]

TORCH_DTYPE_NAMES = MappingProxyType(
    {
        "BOOL": "bool",
        "U8": "uint8",
        "I8": "int8",
        "I16": "int16",
        "U16": "uint16",
        "I32": "int32",
        "U32": "uint32",
        "I64": "int64",
        "U64": "uint64",
        "F16": "float16",
        "BF16": "bfloat16",
        "F32": "float32",
        "F64": "float64",
    }
)
"""safetensors' type names (a header's ``dtype``) and torch's names of the same types (``torch.<name>``)."""

FLOATING_POINT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
"""The safetensors type names of :data:`TORCH_DTYPE_NAMES` that are floating point."""

_MAX_HEADER_BYTES = 100_000_000
"""The largest header the safetensors library reads."""


class SafetensorsHeaderError(ValueError):
    """The file is not a complete safetensors file; the message says what is wrong, not which file."""


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor as the header describes it."""

    dtype: str
    """safetensors' type name: ``F32``, ``BF16``, ``F16``, ``I64``, ``BOOL``, ..."""
    shape: tuple[int, ...]
    """The tensor's shape."""


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    """The tensors (in the header's order) and the ``__metadata__`` strings of a safetensors file."""

    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    """Read and check the header of the safetensors file ``path``; no tensor data is read.

    Raises:
        SafetensorsHeaderError: A header length past the end of the file, a header that is not a JSON object of
            tensor entries (``dtype``, ``shape``, ``data_offsets``), or tensor data past the end of the file
            (a truncated file).
        OSError: The file cannot be opened.
    """
    size = os.stat(path).st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise SafetensorsHeaderError(f"the file has {size} bytes, fewer than the 8 of the header length")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(_MAX_HEADER_BYTES, size - 8):
            raise SafetensorsHeaderError(f"its header length {length} does not fit the file of {size} bytes")
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SafetensorsHeaderError(f"its header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise SafetensorsHeaderError(f"its header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsHeaderError("its __metadata__ is not an object of strings")
    tensors: dict[str, TensorEntry] = {}
    data_end = 0
    for name, entry in header.items():
        tensors[name] = _entry(name, entry)
        data_end = max(data_end, entry["data_offsets"][1])
    needed = 8 + length + data_end
    if needed > size:
        raise SafetensorsHeaderError(f"its tensors end at byte {needed}, past the end of the file ({size} bytes)")
    return SafetensorsHeader(tensors=tensors, metadata={str(k): v for k, v in metadata.items()})


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(name: str, entry: object) -> TensorEntry:
    if not isinstance(entry, dict):
        raise SafetensorsHeaderError(f"its header entry of tensor {name!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if (
        not isinstance(dtype, str)
        or not isinstance(shape, list)
        or not all(_is_count(n) for n in shape)
        or not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_count(n) for n in offsets)
        or offsets[0] > offsets[1]
    ):
        raise SafetensorsHeaderError(f"its header entry of tensor {name!r} lacks a dtype, shape or data_offsets")
    return TensorEntry(dtype=dtype, shape=tuple(shape))
