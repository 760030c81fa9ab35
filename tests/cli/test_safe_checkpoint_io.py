"""Checkpoints are staged beside their target and renamed: a save cut short leaves the previous one whole."""

import os
from pathlib import Path

import pytest
import torch

from bionemo.recipes.safe_checkpoint_io import SafeCheckpointIO


class Unpicklable:
    def __reduce__(self):
        raise KeyboardInterrupt  # a second Ctrl-C in the middle of writing


def test_the_temporary_file_is_renamed_from_the_target_directory(tmp_path, monkeypatch):
    renamed = []
    replace = os.replace

    def recording(src, dst):
        renamed.append((Path(src), Path(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "replace", recording)
    target = tmp_path / "checkpoints" / "last.ckpt"
    SafeCheckpointIO().save_checkpoint({"global_step": 3, "w": torch.ones(2)}, target)
    # same directory, so one rename on one filesystem: the name never points at a partial file
    assert [(src.parent, dst) for src, dst in renamed] == [(target.parent, target)]
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]
    loaded = SafeCheckpointIO().load_checkpoint(target)
    assert loaded["global_step"] == 3
    assert torch.equal(loaded["w"], torch.ones(2))
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()


def test_an_interrupted_save_leaves_the_previous_checkpoint(tmp_path):
    target = tmp_path / "last.ckpt"
    io = SafeCheckpointIO()
    io.save_checkpoint({"global_step": 10}, target)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"global_step": 20, "bad": Unpicklable()}, target)
    assert io.load_checkpoint(target)["global_step"] == 10
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left behind


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask
