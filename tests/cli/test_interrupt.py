"""Ctrl-C and SIGTERM during `bionemo run train`: a checkpoint, the resume command, exit 130 / 143, and a rerun
of that command continues from the checkpoint."""

import shlex
import signal
from pathlib import Path

import pytest
import torch

from support.interrupted_runs import MAX_STEPS, start, steps_shown, stop_once


def test_ctrl_c_then_sigterm_save_checkpoints_that_the_printed_command_resumes(tmp_path):
    out = tmp_path / "run"
    train = ["run", "train", "--max-steps", MAX_STEPS, "--val-check-interval", MAX_STEPS, "--seed", "3"]
    first = start([*train, "--output-dir", str(out), "--no-resume"], tmp_path, tmp_path / "first.log")
    stopped = stop_once(first, tmp_path / "first.log", 2, signal.SIGINT)
    step = int(stopped["step"])
    assert step >= 2
    checkpoint = out / "checkpoints" / "last.ckpt"
    assert Path(stopped["checkpoint"]) == checkpoint
    assert torch.load(checkpoint, weights_only=True)["global_step"] == step
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["last.ckpt"]  # no partial or temporary file
    assert not (out / "model.safetensors").exists()
    command = shlex.split(stopped["command"])
    assert command[:3] == ["bionemo", "run", "train"]
    assert "--no-resume" not in command  # the rerun must resume
    assert command[command.index("--output-dir") + 1] == str(out)

    # the printed command, run again: its bar starts at the checkpoint's step, then SIGTERM stops it
    second = start(command[1:], tmp_path, tmp_path / "second.log")
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
