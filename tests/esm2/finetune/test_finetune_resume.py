"""A rerun of `bionemo run finetune` with the same --output-dir continues from the run's checkpoint; another run's
checkpoints there are refused (exit 2, nothing written) unless --no-resume, which removes them and starts afresh."""

import json

from support.cli_runs import bionemo, bionemo_refused
from support.finetune_data import write_csv
from support.hf_esm import random_hf_esm


def _files(folder):
    return {path: path.stat().st_mtime_ns for path in folder.rglob("*")}


def test_rerun_resumes_and_exports_the_longer_run(tmp_path):
    random_hf_esm(tmp_path / "base", hidden=32, heads=2, layers=2)
    data = write_csv(tmp_path / "train.csv", 48, seed=1)
    run = tmp_path / "run"
    common = ("run", "finetune", "--checkpoint", str(tmp_path / "base"), "--data", str(data), "--task", "regression",
              "--label-column", "score", "--output-dir", str(run), "--accelerator", "cpu",
              "--val-check-interval", "3")  # fmt: skip
    bionemo(*common, "--max-steps", "3", cwd=tmp_path)
    first = json.loads((run / "summary.json").read_text())
    assert first["steps"] == 3
    result = bionemo(*common, "--max-steps", "6", cwd=tmp_path)
    assert f"resuming from {run / 'checkpoints' / 'last.ckpt'}" in result.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6
    assert summary["best"]["step"] in (3, 6)
    # the best of before the resume still counts (its weights were written beside the checkpoint)
    assert (run / "checkpoints" / "best-weights-rank0.safetensors").is_file()
    assert summary["best"]["value"] >= first["best"]["value"]

    # another task into the same folder: refused before anything is written, naming what differs
    other = write_csv(tmp_path / "other.csv", 48, seed=2)
    before = _files(run)
    another = ("run", "finetune", "--checkpoint", str(tmp_path / "base"), "--data", str(other), "--task",
               "classification", "--label-column", "kind", "--output-dir", str(run), "--accelerator", "cpu",
               "--val-check-interval", "3", "--max-steps", "3")  # fmt: skip
    message = bionemo_refused(*another, cwd=tmp_path)
    assert f"--output-dir {run} holds the checkpoints of another run (last.ckpt)" in message
    assert 'data.train.sha256 "' in message  # other records
    assert 'finetune.task "regression" -> "classification"' in message
    assert "--no-resume" in message
    assert _files(run) == before

    # --no-resume: the earlier run's checkpoints go, the new run starts at step 0 and is the one a rerun resumes
    result = bionemo(*another, "--no-resume", cwd=tmp_path)
    assert f"--no-resume: removed the earlier checkpoints in {run / 'checkpoints'} (last.ckpt)" in result.stderr
    assert "resuming from" not in result.stderr
    assert json.loads((run / "summary.json").read_text())["steps"] == 3
    assert json.loads((run / "checkpoints" / "run.json").read_text())["finetune"]["task"] == "classification"
    result = bionemo(*another[:-1], "5", cwd=tmp_path)
    assert "resuming from" in result.stderr
    assert json.loads((run / "summary.json").read_text())["steps"] == 5
