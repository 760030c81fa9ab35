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


def test_every_esm2_recipe_satisfies_the_recipe_protocol():
    from dataclasses import replace

    from bionemo.esm2 import recipes
    from bionemo.recipes.registry import Recipe, RecipeDefaults

    for name, target in RECIPE_TARGETS.items():
        recipe = getattr(recipes, target.split(":")[1])()
        assert isinstance(recipe, recipes.ESM2Recipe)
        assert isinstance(recipe, Recipe)
        assert isinstance(recipe.defaults, RecipeDefaults)
        assert recipe.name == name
        assert set(recipe.model) <= recipes.MODEL_KEYS
    with pytest.raises(ValueError, match="unknown model settings \\['num_layer'\\]"):
        recipes.ESM2Recipe(name="x", description="", defaults=replace(recipes.demo().defaults, model={"num_layer": 4}))


def test_recipe_defaults_refuse_bad_values_naming_the_field():
    from bionemo.recipes.registry import RecipeDefaults

    valid = {"micro_batch_size": 1, "global_batch_size": 1, "max_steps": 1, "val_check_interval": 1, "lr": 1.0}
    with pytest.raises(ValueError, match="RecipeDefaults.max_steps must be a positive number, got 0"):
        RecipeDefaults(**{**valid, "max_steps": 0}, precision="32")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="RecipeDefaults.precision 'fp8' is not one of: 32, bf16-mixed, 16-mixed"):
        RecipeDefaults(**valid, precision="fp8")  # pyright: ignore[reportArgumentType]


def not_a_recipe() -> object:
    """An entry point target whose function returns something that is not a Recipe."""
    return {"name": "nope"}


def needs_an_argument(size: int) -> object:
    """An entry point target that is a function needing arguments."""
    return size


NOT_A_FUNCTION = 42
"""An entry point target that is neither a Recipe nor a function."""


@pytest.mark.parametrize(
    ("attribute", "message"),
    [
        ("not_a_recipe", "gave dict, not a Recipe"),
        ("needs_an_argument", "needs arguments; it must be a Recipe or a function of no arguments returning one"),
        ("NOT_A_FUNCTION", "is int, not a Recipe or a function of no arguments returning one"),
    ],
)
def test_an_entry_point_that_gives_no_recipe_is_refused(monkeypatch, attribute, message):
    import bionemo.recipes.registry as registry

    target = f"{__name__}:{attribute}"
    monkeypatch.setitem(registry._FALLBACK, "broken", target)
    with pytest.raises(TypeError, match=message) as refused:
        registry.load_recipe("broken")
    assert target in str(refused.value)
    monkeypatch.setitem(registry._FALLBACK, "works", "bionemo.esm2.recipes:demo")
    assert registry.load_recipe("works").name == "esm2-demo"


def test_typed_model_settings_have_esm2configs_field_types():
    import typing

    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.recipes import ESM2ModelSettings

    fields = typing.get_type_hints(ESM2Config)
    for key, declared in typing.get_type_hints(ESM2ModelSettings).items():
        assert declared == fields[key] or declared in typing.get_args(fields[key]), key


def test_recipes_leave_the_compiled_bias_dropout_add_off_while_dropout_is_zero():
    """With no hidden dropout and the bias inside the GEMM, megatron's compiled bias-dropout-add is one add plus
    torch.compile's host cost per call (docs/benchmarks.md#training-throughput-as-a-share-of-peak)."""
    from bionemo.esm2.model import ESM2Config
    from bionemo.recipes.registry import available_recipes, load_recipe

    assert ESM2Config.hidden_dropout == 0.0
    for name in available_recipes():
        model = load_recipe(name).defaults.model
        assert model.get("hidden_dropout", 0.0) == 0.0, name
        assert not model.get("bias_dropout_fusion", False), name
