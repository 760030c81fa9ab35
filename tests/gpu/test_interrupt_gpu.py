"""SIGTERM during `bionemo run train` under MegatronStrategy: every rank joins the distributed save of a whole
`step<N>` checkpoint, and a rerun resumes from it."""

import signal
import subprocess
from pathlib import Path

import pytest

from bionemo.esm2.checkpoints.weights import read_metadata
from bionemo.recipes.checkpoints import resume_checkpoint
from bionemo.recipes.settings import RunSettings, StrategyChoice
from support.interrupted_runs import BIONEMO, MAX_STEPS, start, stop_once

LAYOUTS = [
    pytest.param([], id="1gpu", marks=pytest.mark.gpu),
    pytest.param(
        ["--devices", "2", "--tensor-parallel", "2", "--strategy", "megatron"], id="tp2", marks=pytest.mark.multi_gpu
    ),
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sigterm_saves_a_whole_distributed_checkpoint_that_a_rerun_resumes(tmp_path, layout):
    out = tmp_path / "run"
    run = ["run", "train", "--output-dir", str(out), "--val-check-interval", MAX_STEPS, *layout]
    process = start([*run, "--max-steps", MAX_STEPS], tmp_path, tmp_path / "train.log")
    stopped = stop_once(process, tmp_path / "train.log", 3, signal.SIGTERM)
    step = int(stopped["step"])
    saved = out / "checkpoints" / f"step{step}"
    assert Path(stopped["checkpoint"]) == saved
    assert (saved / "weights" / "metadata.json").is_file()
    assert resume_checkpoint(RunSettings(strategy=StrategyChoice.MEGATRON), out / "checkpoints") == str(saved)
    result = subprocess.run(
        [*BIONEMO, *run, "--max-steps", str(step + 2)], capture_output=True, text=True, timeout=540, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert read_metadata(out / "model.safetensors")["steps"] == step + 2
    output = result.stdout + result.stderr
    restored = [line for line in output.splitlines() if line.startswith("resuming from ")]
    assert restored, output[-3000:]
    assert f"step{step}" in restored[0], restored
