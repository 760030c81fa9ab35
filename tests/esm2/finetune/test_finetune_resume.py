"""A rerun of `bionemo run finetune` with the same --output-dir continues from the run's checkpoint."""

import json

from support.cli_runs import bionemo
from support.finetune_data import write_csv
from support.hf_esm import random_hf_esm


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
