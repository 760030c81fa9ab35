"""summary.json is strict JSON and the printed summary shows no nan, whatever the checkpoint recorded."""

import json
import re

from safetensors import safe_open
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.esm2.recipes import BUNDLED_CHECKPOINT

runner = CliRunner()


def _no_constants(name: str) -> None:
    raise ValueError(f"summary.json holds {name}, which JSON does not allow")


def test_unmeasured_checkpoint_perplexity_is_null_in_summary_json_and_not_printed_as_nan(tmp_path):
    with safe_open(str(BUNDLED_CHECKPOINT), framework="pt") as f:
        metadata = dict(f.metadata() or {})
    # an older `run train` recorded an unmeasured validation perplexity as NaN
    metadata["val_ppl"] = json.dumps(float("nan"))
    checkpoint = tmp_path / "nan_val_ppl.safetensors"
    save_file(load_file(BUNDLED_CHECKPOINT), checkpoint, metadata)
    out = tmp_path / "out"
    args = ["run", "predict", "--checkpoint", str(checkpoint), "--include", "perplexity", "--output-dir", str(out)]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output

    summary = json.loads((out / "summary.json").read_text(), parse_constant=_no_constants)
    assert summary["checkpoint_validation_perplexity"] is None
    assert summary["untrained_validation_perplexity"] == json.loads(metadata["untrained_val_ppl"])
    assert summary["mean_perplexity"] > 1
    assert summary["predict_seconds"] > 0
    printed = result.output[result.output.index("bionemo run predict") :]
    assert not re.search(r"\bnan\b", printed, re.IGNORECASE), printed
    assert "not recorded" in printed


def test_summary_separates_the_first_batch_from_the_rest_of_the_loop(tmp_path):
    """The first batch pays one-time costs (workers, first kernels); the speed after it is reported too."""
    out = tmp_path / "out"
    args = ["run", "predict", "--include", "embeddings", "--micro-batch-size", "4", "--output-dir", str(out)]
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_no_constants)
    assert 0 < summary["first_batch_seconds"] < summary["predict_seconds"]
    assert summary["tokens_per_second_after_first_batch"] > 0
    assert "speed after the first batch" in result.output


def test_summary_times_the_commands_phases_around_the_loop(tmp_path):
    """Inputs, the Trainer's environment, the model's set-up and the writing, each measured, none inside another."""
    import time

    out = tmp_path / "out"
    args = ["run", "predict", "--include", "embeddings", "--output-dir", str(out)]
    start = time.perf_counter()
    result = runner.invoke(app, args, terminal_width=200)
    wall = time.perf_counter() - start
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text(), parse_constant=_no_constants)
    phases = summary["phase_seconds"]
    assert set(phases) == {"inputs", "trainer_environment", "model_setup", "write"}
    assert all(seconds > 0 for seconds in phases.values()), phases
    assert sum(phases.values()) + summary["predict_seconds"] < wall


def test_speed_after_the_first_batch_leaves_out_its_tokens_and_seconds():
    from bionemo.esm2.recipes.predict import _speed

    timing = {"tokens": 1000, "predict_seconds": 3.0, "first_batch_seconds": 1.0, "first_batches_tokens": 200}
    assert _speed(timing)["tokens_per_second_after_first_batch"] == 400.0
    assert _speed(timing)["tokens_per_second"] == 1000 / 3.0
    one_batch = _speed({**timing, "first_batches_tokens": 1000})  # nothing after it
    assert one_batch["tokens_per_second_after_first_batch"] is None
    assert _speed({**timing, "first_batch_seconds": None})["tokens_per_second_after_first_batch"] is None
    assert _speed({}) == {
        "tokens": 0, "predict_seconds": None, "tokens_per_second": None, "first_batch_seconds": None,
        "tokens_per_second_after_first_batch": None,
    }  # fmt: skip


def test_the_summary_says_which_precision_prediction_computed_in_also_on_cpu(tmp_path):
    """`--precision bf16-mixed` on a CPU applies (parameters in bf16): the summary says so, as for float32."""
    shown = {}
    for precision, computed in (("32", "float32"), ("bf16-mixed", "bfloat16")):
        out = tmp_path / precision
        args = ["run", "predict", "--include", "embeddings", "--precision", precision, "--output-dir", str(out)]
        result = runner.invoke(app, args, env={"COLUMNS": "200"})  # the summary table on one line per row
        assert result.exit_code == 0, result.output
        assert f"{precision}: computed in {computed}; embeddings and logits written as float32" in result.output
        assert json.loads((out / "summary.json").read_text())["precision"] == precision
        with safe_open(str(out / "predictions.safetensors"), framework="pt") as f:
            shown[precision] = f.get_tensor("embeddings")
    assert not shown["32"].equal(shown["bf16-mixed"])  # and bf16 did run
