"""Ctrl-C and SIGTERM during `bionemo run train`: a checkpoint, the resume command, exit 130 / 143, and a rerun
of that command, run as printed, continues from the checkpoint."""

import os
import shlex
import signal
import sys
from pathlib import Path

import pytest
import torch

from support.interrupted_runs import MAX_STEPS, launch, start, steps_shown, stop_once


def test_ctrl_c_then_sigterm_save_checkpoints_that_the_printed_command_resumes(tmp_path):
    out = tmp_path / "run"
    train = ["run", "train", "--max-steps", MAX_STEPS, "--val-check-interval", MAX_STEPS, "--seed", "3"]
    first = start([*train, "--output-dir", str(out), "--no-resume"], tmp_path, tmp_path / "first.log")
    # SIGINT, and its copy right after the run noted it, as `uv run` under `timeout -s INT` delivers it: one Ctrl-C
    stopped = stop_once(first, tmp_path / "first.log", 2, signal.SIGINT, copies=2)
    step = int(stopped["step"])
    assert step >= 2
    checkpoint = out / "checkpoints" / "last.ckpt"
    assert Path(stopped["checkpoint"]) == checkpoint
    assert torch.load(checkpoint, weights_only=True)["global_step"] == step
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["last.ckpt", "run.json"]  # no partial or temporary
    assert not (out / "model.safetensors").exists()
    command = shlex.split(stopped["command"])
    # started as `python -m bionemo.cli`, under `uv run` when pytest is (the run inherits uv's variables)
    if "UV_RUN_RECURSION_DEPTH" in os.environ:
        assert command[0] in ("uv", os.environ.get("UV"))
        assert command[1:7] == ["run", "python", "-m", "bionemo.cli", "run", "train"]
    else:
        assert command[0] in ("python", sys.executable)  # by name where PATH finds this interpreter so
        assert command[1:5] == ["-m", "bionemo.cli", "run", "train"]
    assert "--no-resume" not in command  # the rerun must resume
    assert command[command.index("--output-dir") + 1] == str(out)

    # the printed command, run again as printed: its bar starts at the checkpoint's step, then SIGTERM stops it
    second = launch(command, tmp_path, tmp_path / "second.log")
    stopped = stop_once(second, tmp_path / "second.log", 1, signal.SIGTERM)
    resumed_at = min(n for n in steps_shown(tmp_path / "second.log") if n > 0)
    assert resumed_at == step  # a fresh run would show 1 first
    later = int(stopped["step"])
    assert later > step
    assert Path(stopped["checkpoint"]) == checkpoint
    assert torch.load(checkpoint, weights_only=True)["global_step"] == later


@pytest.mark.multiprocess
def test_sigterm_to_the_launching_process_stops_both_ddp_ranks_after_the_same_step(tmp_path):
    # only rank 0 gets the signal: rank 1 learns of it from the per-step reduction and joins the save
    out = tmp_path / "ddp"
    train = ["run", "train", "--devices", "2", "--accelerator", "cpu", "--output-dir", str(out)]
    log = tmp_path / "ddp.log"
    process = start([*train, "--max-steps", MAX_STEPS, "--val-check-interval", MAX_STEPS], tmp_path, log)
    stopped = stop_once(process, log, 1, signal.SIGTERM)
    step = int(stopped["step"])
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == step >= 1
