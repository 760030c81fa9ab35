"""Summaries never cut a path: in an 80-column terminal or a pipe, every written path is printed whole."""

import io
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.cli.summary import print_summary

runner = CliRunner()


def _long_dir(tmp_path: Path) -> Path:
    return tmp_path / ("a_rather_long_directory_name_" * 3) / ("and_a_second_long_level_" * 2)


def test_paths_are_printed_whole_below_the_table_and_long_text_wraps():
    out = io.StringIO()
    path = Path("/scratch/" + "very_long_folder_name/" * 8 + "predictions.safetensors")
    text = "word " * 40
    print_summary("title", [("predictions", path), ("note", text)], console=Console(file=out, width=80))
    lines = out.getvalue().splitlines()
    assert f"predictions: {path}" in lines
    assert max(len(line) for line in lines if "predictions:" not in line) <= 80
    assert " ".join(out.getvalue().replace("│", " ").split()).count("word") == 40  # wrapped, nothing cut
    assert "…" not in out.getvalue()


def test_predict_and_train_summaries_show_whole_paths_at_80_columns(tmp_path):
    out = _long_dir(tmp_path)
    predicted = runner.invoke(app, ["run", "predict", "--output-dir", str(out / "p"), "--include", "embeddings"],
                              terminal_width=80)  # fmt: skip
    assert predicted.exit_code == 0, predicted.output
    lines = predicted.output.splitlines()
    for name in ("predictions.safetensors", "summary.json"):
        assert any(line.endswith(str(out / "p" / name)) for line in lines), predicted.output
    trained = runner.invoke(app, ["run", "train", "--max-steps", "2", "--val-check-interval", "1",
                                  "--output-dir", str(out / "t")], terminal_width=80)  # fmt: skip
    assert trained.exit_code == 0, trained.output
    lines = trained.output.splitlines()
    for name in ("model.safetensors", "checkpoints", "logs", "settings.yaml", "training_curves.png"):
        assert any(line.endswith(str(out / "t" / name)) for line in lines), trained.output
    for result, command in ((predicted, "predict"), (trained, "train")):
        summary = result.output[result.output.index(f"bionemo run {command}") :]  # the progress bar may cut
        assert "…" not in summary, summary
