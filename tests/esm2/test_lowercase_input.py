"""Lower-case sequences are read as upper case, and the predict and train summaries say how many there were."""

import json

import torch
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.esm2.data.readers import read_sequences
from bionemo.esm2.recipes import BUNDLED_SEQUENCES
from bionemo.recipes.outputs import read_predictions

runner = CliRunner()
NOTE = "had lowercase letters, read as uppercase"


def _fasta(path, records, lower: set[int]) -> str:
    path.write_text(
        "".join(f">{r.id}\n{r.sequence.lower() if i in lower else r.sequence}\n" for i, r in enumerate(records))
    )
    return str(path)


def _flat(text: str) -> str:
    for border in "│┃╭╮╰╯─┌┐└┘├┤┬┴┼":
        text = text.replace(border, " ")
    return " ".join(text.split())


def test_predict_reads_lowercase_as_uppercase_and_counts_it_in_the_summary(tmp_path):
    records = read_sequences(BUNDLED_SEQUENCES)[:5]
    outputs = {}
    for name, lower in (("upper", set()), ("mixed", {1, 3})):
        out = tmp_path / name
        args = [
            "run",
            "predict",
            "--data",
            _fasta(tmp_path / f"{name}.fasta", records, lower),
            "--output-dir",
            str(out),
        ]
        result = runner.invoke(app, [*args, "--include", "embeddings"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        summary = json.loads((out / "summary.json").read_text())
        assert summary["lowercase_sequences"] == len(lower)
        printed = _flat(result.output[result.output.index("bionemo run predict") :])
        assert (f"input 2 sequences {NOTE}" in printed) == bool(lower), printed
        assert NOTE in printed or not lower
        outputs[name] = read_predictions(out / "predictions.safetensors")[1]["embeddings"]
    torch.testing.assert_close(outputs["mixed"], outputs["upper"], rtol=0, atol=0)


def test_train_summary_counts_lowercase_sequences(tmp_path):
    records = read_sequences(BUNDLED_SEQUENCES)[:12]
    data = _fasta(tmp_path / "mixed.fasta", records, {0})
    args = ["run", "train", "--data", data, "--max-steps", "1", "--val-check-interval", "1"]
    result = runner.invoke(app, [*args, "--output-dir", str(tmp_path / "run")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    printed = _flat(result.output[result.output.index("bionemo run train") :])
    assert f"sequences (train / val) 11 / 1 input 1 sequence {NOTE}" in printed, printed
