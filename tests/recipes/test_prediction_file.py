"""The merged prediction file: each tensor type kept through the hand-written header, and the usual file mode."""

import os
import stat

import pytest
import torch
from safetensors.torch import load_file, save_file

from bionemo.recipes.outputs import assemble_predictions, read_predictions

TYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool, torch.uint8]


@pytest.mark.parametrize("dtype", TYPES, ids=str)
def test_every_tensor_type_reads_back_as_the_shards_wrote_it(tmp_path, dtype):
    values = torch.arange(6).reshape(3, 2).to(dtype)
    save_file({"sample_index": torch.tensor([2, 0]), "out": values[[2, 0]]}, str(tmp_path / "a.safetensors"))
    save_file({"sample_index": torch.tensor([1]), "out": values[[1]]}, str(tmp_path / "b.safetensors"))
    shards = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
    path = assemble_predictions(tmp_path / "out.safetensors", shards, [1, 1, 1], ["x", "y", "z"], {})
    ids, tensors = read_predictions(path)
    assert ids == ["x", "y", "z"]
    assert tensors["out"].dtype == dtype
    assert torch.equal(tensors["out"], values)
    assert torch.equal(load_file(str(path))["out"], values)  # the safetensors library reads the header alike


def test_the_file_gets_the_mode_open_gives(tmp_path):
    save_file({"sample_index": torch.tensor([0]), "out": torch.ones(1, 2)}, str(tmp_path / "a.safetensors"))
    previous = os.umask(0o027)
    try:
        path = assemble_predictions(tmp_path / "out.safetensors", [tmp_path / "a.safetensors"], [1], ["x"], {})
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
