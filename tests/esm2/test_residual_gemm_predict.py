"""`bionemo run predict` takes the residual-in-GEMM path wherever its device condition holds, with the same outputs.

The path runs on GPUs in half precision only; here that one condition is stood in for (fp32 on CPU, where the path
is the same arithmetic), so that everything else the command puts around the model (Lightning's strategy and
callbacks, the ESM-2 model's call of its block) is what decides, as on a GPU.
"""

import torch
from typer.testing import CliRunner

import bionemo.layers.residual_gemm as residual_gemm
from bionemo.cli.app import app
from bionemo.recipes.outputs import read_predictions
from support.hf_esm import random_hf_esm, random_sequences

runner = CliRunner()


def test_run_predict_takes_the_residual_gemms_and_gives_the_same_predictions(tmp_path, monkeypatch):
    random_hf_esm(tmp_path / "hf", hidden=64, heads=4, layers=3)
    fasta = tmp_path / "sequences.fasta"
    fasta.write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(random_sequences(6, seed=4))))
    calls = []
    path = residual_gemm.forward_residual_in_gemm
    monkeypatch.setattr(residual_gemm, "_half_on_gpu", lambda hidden: True)
    monkeypatch.setattr(residual_gemm, "forward_residual_in_gemm", lambda *args: calls.append(1) or path(*args))

    def predict(name: str) -> dict[str, torch.Tensor]:
        out = tmp_path / name
        args = ["run", "predict", "--checkpoint", str(tmp_path / "hf"), "--data", str(fasta), "--output-dir", str(out)]
        args += ["--include", "embeddings", "--include", "logits", "--micro-batch-size", "4"]
        result = runner.invoke(app, args, terminal_width=300)
        assert result.exit_code == 0, result.output + repr(result.exception)
        return read_predictions(out / "predictions.safetensors")[1]

    fused = predict("fused")
    assert len(calls) == 2  # both batches
    monkeypatch.setenv(residual_gemm.SWITCH, "0")
    reference = predict("megatron")
    assert len(calls) == 2
    for key in ("embeddings", "logits"):
        torch.testing.assert_close(fused[key], reference[key], rtol=1e-5, atol=1e-5)
