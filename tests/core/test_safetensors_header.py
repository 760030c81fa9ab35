"""The standard-library safetensors header reader against the safetensors library, and on damaged files."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from bionemo.core.safetensors_header import (
    FLOATING_POINT_DTYPES,
    TORCH_DTYPE_NAMES,
    SafetensorsHeaderError,
    TensorEntry,
    read_safetensors_header,
)


def test_the_header_matches_what_the_library_reads(tmp_path):
    tensors = {
        "a.weight": torch.randn(3, 4),
        "b": torch.zeros(5, dtype=torch.bfloat16),
        "ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "scalar": torch.tensor(1.5, dtype=torch.float16),
        "empty": torch.zeros(0, 7),
    }
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path), metadata={"model": '{"num_layers": 2}', "x": "y"})
    header = read_safetensors_header(path)
    with safe_open(str(path), framework="pt") as f:
        slices = {key: f.get_slice(key) for key in f.keys()}  # noqa: SIM118 - safe_open is not a mapping
        expected = {key: TensorEntry(piece.get_dtype(), tuple(piece.get_shape())) for key, piece in slices.items()}
        assert header.metadata == f.metadata()
    assert header.tensors == expected
    assert header.tensors["b"] == TensorEntry("BF16", (5,))
    assert header.tensors["scalar"] == TensorEntry("F16", ())


def test_a_file_without_metadata_has_empty_metadata(tmp_path):
    save_file({"a": torch.ones(2)}, str(tmp_path / "m.safetensors"))
    assert read_safetensors_header(tmp_path / "m.safetensors").metadata == {}


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "good.safetensors"
    save_file({"a": torch.randn(64, 64), "b": torch.randn(64)}, str(path), metadata={"k": "v"})
    return path


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[: len(data) // 2], "past the end of the file"),  # truncated in the tensor data
        (lambda data: data[:40], "does not fit the file"),  # truncated in the header
        (lambda data: data[:5], "fewer than the 8"),
        (lambda data: b"\x00\x01 not a safetensors file", "does not fit the file"),
        (lambda data: (4).to_bytes(8, "little") + b"[1] ", "not an object"),
        (lambda data: (4).to_bytes(8, "little") + b"{oops", "not JSON"),
        (lambda data: (20).to_bytes(8, "little") + b'{"a": {"dtype": 1}} ', "lacks a dtype, shape or data_offsets"),
    ],
)
def test_damaged_files_are_refused_and_the_library_refuses_them_too(good, damage, message):
    data = damage(good.read_bytes())
    good.write_bytes(data)
    with pytest.raises(SafetensorsHeaderError, match=message):
        read_safetensors_header(good)
    with pytest.raises(Exception), safe_open(str(good), framework="pt") as f:  # noqa: B017, PT011
        f.get_tensor("a")


def test_the_dtype_names_are_those_safetensors_writes_for_each_torch_type(tmp_path):
    tensors = {code: torch.zeros(2, dtype=getattr(torch, name)) for code, name in TORCH_DTYPE_NAMES.items()}
    save_file(tensors, str(tmp_path / "all.safetensors"))
    header = read_safetensors_header(tmp_path / "all.safetensors")
    assert {key: entry.dtype for key, entry in header.tensors.items()} == {code: code for code in tensors}
    assert {code for code, t in tensors.items() if t.is_floating_point()} == FLOATING_POINT_DTYPES
