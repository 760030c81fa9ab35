"""The ESM-2 family as recipes: shapes and parameter counts as published, each one trainable here."""

import pytest
import torch
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.esm2.catalog import ESM2_SHAPES, RECIPE_TARGETS

runner = CliRunner()


def test_parameter_counts_are_the_ones_transformers_counts():
    from transformers import EsmConfig, EsmForMaskedLM

    for name in ("esm2-8m", "esm2-35m"):
        shape = ESM2_SHAPES[name]
        config = EsmConfig(
            vocab_size=33, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_layers,
            num_attention_heads=shape.num_attention_heads, intermediate_size=shape.ffn_hidden_size,
            max_position_embeddings=1026, position_embedding_type="rotary", token_dropout=True,
            mask_token_id=32, pad_token_id=1,
        )  # fmt: skip
        model = EsmForMaskedLM(config)
        counted = sum(p.numel() for n, p in model.named_parameters() if "contact_head" not in n)
        assert shape.parameters() == counted, name
    # the published sizes: 8M, 35M, 150M, 650M, 3B, 15B (fair-esm counts the contact head too)
    sizes = {name: shape.parameters() for name, shape in ESM2_SHAPES.items()}
    assert [round(sizes[n] / 1e6) for n in ("esm2-8m", "esm2-35m", "esm2-150m", "esm2-650m")] == [8, 34, 148, 651]
    assert round(sizes["esm2-3b"] / 1e9, 1) == 2.8
    assert round(sizes["esm2-15b"] / 1e9, 1) == 15.1


def test_every_recipe_is_registered_as_an_entry_point():
    import tomllib
    from pathlib import Path

    declared = tomllib.loads((Path(__file__).parents[2] / "packages/bionemo-esm2/pyproject.toml").read_text())
    assert declared["project"]["entry-points"]["bionemo.recipes"] == RECIPE_TARGETS


@pytest.mark.parametrize("recipe", ["esm2-8m"])
def test_a_family_recipe_trains_from_scratch_on_cpu(tmp_path, recipe):
    from safetensors import safe_open

    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["run", "train", "--recipe", recipe, "--max-steps", "2", "--micro-batch-size", "4", "--global-batch-size",
         "4", "--val-check-interval", "2", "--accelerator", "cpu", "--output-dir", str(out)],
        terminal_width=300,
    )  # fmt: skip
    assert result.exit_code == 0, result.output + repr(result.exception)
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert f.get_slice("embedding.word_embeddings.weight").get_shape() == [33, ESM2_SHAPES[recipe].hidden_size]
        weights = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    assert sum(t.numel() for t in weights.values()) == ESM2_SHAPES[recipe].parameters()
    assert all(torch.isfinite(t).all() for t in weights.values())


def test_recipes_show_output_works_as_config_for_train_and_predict(tmp_path):
    shown = runner.invoke(app, ["recipes", "show", "esm2-demo"])
    assert shown.exit_code == 0
    config = tmp_path / "demo.json"
    config.write_text(shown.output)
    train = runner.invoke(
        app,
        ["run", "train", "--config", str(config), "--max-steps", "2", "--val-check-interval", "2",
         "--accelerator", "cpu", "--output-dir", str(tmp_path / "train")],
        terminal_width=300,
    )  # fmt: skip
    assert train.exit_code == 0, train.output + repr(train.exception)
    predict = runner.invoke(
        app,
        ["run", "predict", "--config", str(config), "--accelerator", "cpu", "--output-dir", str(tmp_path / "pred")],
        terminal_width=300,
    )
    assert predict.exit_code == 0, predict.output + repr(predict.exception)
    assert (tmp_path / "pred" / "predictions.safetensors").exists()
    other = tmp_path / "other.json"  # a model that is not the checkpoint's is refused, naming the setting
    other.write_text(shown.output.replace('"num_layers": 4', '"num_layers": 6'))
    refused = runner.invoke(app, ["run", "predict", "--config", str(other), "--output-dir", str(tmp_path / "no")],
                            terminal_width=300)  # fmt: skip
    assert refused.exit_code == 2
    text = " ".join(refused.output.replace("│", " ").split())
    assert "model setting num_layers=6 differs from the checkpoint's 4" in text
    assert not (tmp_path / "no").exists()
