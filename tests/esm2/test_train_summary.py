"""The training summary and the exported weights never hold nan / null for metrics measured earlier."""

import json
import re

from safetensors import safe_open
from typer.testing import CliRunner

from bionemo.cli.app import app

runner = CliRunner()


def test_rerunning_a_finished_run_keeps_its_metrics_and_prints_no_nan(tmp_path):
    args = ["run", "train", "--max-steps", "4", "--val-check-interval", "2", "--output-dir", str(tmp_path / "r")]
    first = runner.invoke(app, args, terminal_width=200)
    assert first.exit_code == 0, first.output
    measured = json.loads((tmp_path / "r" / "summary.json").read_text())
    again = runner.invoke(app, args, terminal_width=200)  # resumes at max_steps: nothing new is measured
    assert again.exit_code == 0, again.output
    for result in (first, again):
        summary = result.output[result.output.index("bionemo run train") :]
        assert not re.search(r"\bnan\b", summary, re.IGNORECASE), summary
    with safe_open(str(tmp_path / "r" / "model.safetensors"), framework="pt") as f:
        metadata = {key: json.loads(value) for key, value in (f.metadata() or {}).items()}
    assert metadata["steps"] == 4
    assert isinstance(metadata["val_ppl"], float)
    assert measured["timed_steps"] == 1  # the first 3 steps hold one-time costs
    assert measured["train_tokens_per_second"] > 0
    assert measured["model_tflops_per_gpu"] is None  # FLOP/s and share of peak on GPUs only
    assert (measured["steps"], measured["val_ppl"], measured["device"]) == (4, metadata["val_ppl"], "cpu")
    assert json.loads((tmp_path / "r" / "summary.json").read_text()) == measured  # the rerun trained no step
