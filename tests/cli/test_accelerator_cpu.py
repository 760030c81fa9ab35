"""``--accelerator cpu`` on a machine with a GPU stays on the CPU: model built there, batches moved there."""

import torch
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.recipes.outputs import read_predictions
from support.hf_esm import random_hf_esm, random_sequences

runner = CliRunner()


def _predict(tmp_path, name: str) -> dict[str, torch.Tensor]:
    out = tmp_path / name
    args = ["run", "predict", "--checkpoint", str(tmp_path / "hf"), "--data", str(tmp_path / "in.fasta")]
    result = runner.invoke(app, [*args, "--output-dir", str(out), "--accelerator", "cpu"], terminal_width=200)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return read_predictions(out / "predictions.safetensors")[1]


def test_cpu_accelerator_on_a_gpu_machine_predicts_on_the_cpu(tmp_path, monkeypatch):
    random_hf_esm(tmp_path / "hf")
    (tmp_path / "in.fasta").write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(random_sequences(4, seed=1))))
    expected = _predict(tmp_path, "plain")
    # what a GPU machine answers; any CUDA use (model built on cuda, batches moved to cuda) fails here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    outputs = _predict(tmp_path, "gpu-host")
    for key, value in expected.items():
        torch.testing.assert_close(outputs[key], value, rtol=0, atol=0)
