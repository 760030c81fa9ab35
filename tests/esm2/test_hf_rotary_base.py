"""The rotary base across ``bionemo convert``: Hugging Face's ESM-2 knows base 10000 only."""

import json

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.esm2.checkpoints.weights import read_metadata, read_weights, save_weights
from bionemo.esm2.recipes import BUNDLED_CHECKPOINT
from support.hf_esm import edit_weights, random_hf_esm

runner = CliRunner()


def flat(output: str) -> str:
    for border in "│╭╮╰╯─":
        output = output.replace(border, " ")
    return " ".join(output.split())


def inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """RoPE's inverse frequencies ``base ** (-2i / head_dim)``, ``i < head_dim / 2``."""
    return 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)


def with_rotary_base(path, base: float):
    """The bundled demo weights, their metadata saying ``rotary_base``."""
    metadata = read_metadata(BUNDLED_CHECKPOINT)
    metadata["model"] = {**metadata["model"], "rotary_base": base}
    save_weights(read_weights(BUNDLED_CHECKPOINT), path, metadata)
    return path


def test_to_hf_refuses_another_rotary_base_naming_it_and_writes_nothing(tmp_path):
    source = with_rotary_base(tmp_path / "w.safetensors", 500000.0)
    out = tmp_path / "hf"
    result = runner.invoke(app, ["convert", "to-hf", str(source), str(out)], terminal_width=400)
    assert result.exit_code == 2, result.output
    message = flat(result.output)
    assert "rotary_base 500000.0" in message
    assert "10000" in message
    assert not out.exists()


def test_to_hf_writes_the_inverse_frequencies_of_the_models_rotary_base(tmp_path):
    from transformers.models.esm.modeling_esm import RotaryEmbedding

    source = with_rotary_base(tmp_path / "w.safetensors", 10000.0)
    result = runner.invoke(app, ["convert", "to-hf", str(source), str(tmp_path / "hf")], terminal_width=400)
    assert result.exit_code == 0, result.output
    written = load_file(tmp_path / "hf" / "model.safetensors")
    head_dim = 64 // 4  # the demo's hidden size / heads
    for i in range(4):
        buffer = written[f"esm.encoder.layer.{i}.attention.self.rotary_embeddings.inv_freq"]
        torch.testing.assert_close(buffer, inv_freq(head_dim, 10000.0))
        torch.testing.assert_close(buffer, RotaryEmbedding(head_dim).inv_freq)


def test_from_hf_records_rotary_base_10000(tmp_path):
    random_hf_esm(tmp_path / "hf", hidden=64, heads=4, layers=2)
    out = tmp_path / "w.safetensors"
    result = runner.invoke(app, ["convert", "from-hf", str(tmp_path / "hf"), str(out)], terminal_width=400)
    assert result.exit_code == 0, result.output
    with safe_open(str(out), framework="pt") as f:
        model = json.loads(f.metadata()["model"])
    assert model["rotary_base"] == 10000.0


def test_from_hf_refuses_a_folder_whose_rotary_buffers_have_another_base(tmp_path):
    random_hf_esm(tmp_path / "hf", hidden=64, heads=4, layers=2)

    def rebase(tensors):
        tensors["esm.encoder.layer.1.attention.self.rotary_embeddings.inv_freq"] = inv_freq(16, 500000.0)

    edit_weights(tmp_path / "hf", rebase)
    out = tmp_path / "w.safetensors"
    result = runner.invoke(app, ["convert", "from-hf", str(tmp_path / "hf"), str(out)], terminal_width=400)
    assert result.exit_code == 2, result.output
    message = flat(result.output)
    assert "esm.encoder.layer.1.attention.self.rotary_embeddings.inv_freq" in message
    assert "10000" in message
    assert not out.exists()
