"""`run predict` never replaces another run's predictions silently: it refuses, and `--overwrite` replaces them."""

import json

from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.recipes.outputs import read_predictions
from support.hf_esm import random_sequences

runner = CliRunner()


def _fasta(path, count: int, seed: int):
    path.write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(random_sequences(count, seed=seed))))
    return str(path)


def _predict(out, data: str, *args: str):
    return runner.invoke(
        app, ["run", "predict", "--data", data, "--output-dir", str(out), "--include", "embeddings", *args],
        terminal_width=300,
    )  # fmt: skip


def test_other_inputs_are_refused_into_a_folder_of_predictions_and_overwrite_replaces_them(tmp_path):
    out = tmp_path / "pred"
    many, few = _fasta(tmp_path / "many.fasta", 6, seed=1), _fasta(tmp_path / "few.fasta", 2, seed=2)
    assert _predict(out, many).exit_code == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}

    refused = _predict(out, few)
    assert refused.exit_code == 2, refused.output
    message = " ".join(refused.output.replace("│", " ").split())
    assert "6 predictions of other inputs or settings" in message
    assert "predictions.safetensors" in message.replace(" ", "")  # rich folds long paths
    assert "--overwrite" in message
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before  # nothing touched

    other_outputs = _predict(out, many, "--include", "cls")  # the same inputs, other outputs: also another run
    assert other_outputs.exit_code == 2, other_outputs.output

    replaced = _predict(out, few, "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    ids, _ = read_predictions(out / "predictions.safetensors")
    assert ids == ["s0", "s1"]
    assert json.loads((out / "summary.json").read_text())["sequences"] == 2


def test_the_same_command_again_rewrites_its_own_predictions(tmp_path):
    out = tmp_path / "pred"
    data = _fasta(tmp_path / "in.fasta", 3, seed=3)
    assert _predict(out, data).exit_code == 0
    _, first = read_predictions(out / "predictions.safetensors")
    again = _predict(out, data)
    assert again.exit_code == 0, again.output
    _, second = read_predictions(out / "predictions.safetensors")
    assert first.keys() == second.keys()
    for key in first:
        assert first[key].equal(second[key]), key
