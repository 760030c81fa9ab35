"""Recipes sized for GPUs train on CPUs with their CPU defaults, unless an option or --config says otherwise."""

import dataclasses
import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.esm2.recipes import ESM2_8M_CPU, demo, esm2_8m
from bionemo.recipes.registry import CPUDefaults, RecipeDefaults
from bionemo.recipes.resolved import resolved_training_settings, save_settings, training_plan
from bionemo.recipes.settings import Precision, RunSettings

runner = CliRunner()

DEFAULTS = RecipeDefaults(
    micro_batch_size=16,
    global_batch_size=256,
    max_steps=500_000,
    val_check_interval=1000,
    lr=4e-4,
    precision=Precision.BF16,
    cpu=CPUDefaults(max_steps=300, global_batch_size=32, val_check_interval=50),
)
RUN_LENGTH = ("max_steps", "global_batch_size", "micro_batch_size", "val_check_interval")


def run_length(settings: RunSettings) -> tuple:
    return tuple(getattr(settings, name) for name in RUN_LENGTH)


def test_cpu_defaults_apply_on_cpus_only():
    assert run_length(resolved_training_settings(RunSettings(), DEFAULTS, gpu=False)) == (300, 32, 16, 50)
    assert run_length(resolved_training_settings(RunSettings(), DEFAULTS, gpu=True)) == (500_000, 256, 16, 1000)


def test_a_setting_given_as_an_option_or_in_the_config_file_wins(tmp_path):
    given = resolved_training_settings(RunSettings(max_steps=7), DEFAULTS, gpu=False)
    assert run_length(given) == (7, 32, 16, 50)  # the others still CPU-sized
    config = tmp_path / "settings.yaml"
    config.write_text("global_batch_size: 64\nval_check_interval: 5\n")
    from_file = resolved_training_settings(RunSettings.resolve(config, {}), DEFAULTS, gpu=False)
    assert run_length(from_file) == (300, 64, 16, 5)


def test_the_cpu_micro_batch_size_and_the_layout_are_resolved_as_the_recipes_are():
    defaults = dataclasses.replace(DEFAULTS, cpu=CPUDefaults(global_batch_size=24, micro_batch_size=8))
    assert run_length(resolved_training_settings(RunSettings(devices=3), defaults, gpu=False)) == (
        500_000, 24, 8, 1000
    )  # fmt: skip
    assert resolved_training_settings(RunSettings(devices=2), defaults, gpu=False).micro_batch_size == 6  # 24 / 2


def test_the_plan_says_which_cpu_defaults_were_used():
    cpu = RunSettings(recipe="esm2-8m", max_steps=7)
    plan = training_plan(cpu, resolved_training_settings(cpu, DEFAULTS, gpu=False), DEFAULTS, gpu=False)
    assert plan == (
        "7 steps x 32 sequences per step (recipe esm2-8m's defaults for CPUs: --global-batch-size 32, "
        "--val-check-interval 50)"
    )
    gpu = RunSettings(recipe="esm2-8m")
    assert training_plan(gpu, resolved_training_settings(gpu, DEFAULTS, gpu=True), DEFAULTS, gpu=True) == (
        "500000 steps x 256 sequences per step"
    )


def test_settings_yaml_holds_the_cpu_sized_values_and_reruns_them(tmp_path):
    resolved = resolved_training_settings(RunSettings(output_dir=tmp_path), DEFAULTS, gpu=False)
    path = save_settings(resolved, tmp_path, training=True)
    assert [yaml.safe_load(path.read_text())[name] for name in RUN_LENGTH] == [300, 32, 16, 50]
    assert resolved_training_settings(RunSettings.resolve(path, {}), DEFAULTS, gpu=False) == resolved


def test_esm2_8m_trains_a_cpu_sized_run_on_cpus_and_the_demo_keeps_its_own():
    recipe = esm2_8m().defaults
    assert recipe.cpu == ESM2_8M_CPU
    on_cpu = resolved_training_settings(RunSettings(recipe="esm2-8m"), recipe, gpu=False)
    assert (on_cpu.max_steps, on_cpu.global_batch_size) == (ESM2_8M_CPU.max_steps, ESM2_8M_CPU.global_batch_size)
    assert on_cpu.max_steps is not None
    assert on_cpu.global_batch_size is not None
    assert on_cpu.max_steps * on_cpu.global_batch_size < recipe.max_steps * recipe.global_batch_size / 1000
    on_gpu = resolved_training_settings(RunSettings(recipe="esm2-8m"), recipe, gpu=True)
    assert (on_gpu.max_steps, on_gpu.global_batch_size) == (recipe.max_steps, recipe.global_batch_size)
    # CPU-sized already; on CPUs batches by count
    assert demo().defaults.for_training(gpu=False) == dataclasses.replace(demo().defaults, tokens_on_gpus=False)


@pytest.mark.parametrize("given", [{"max_steps": 0}, {"global_batch_size": -1}, {"micro_batch_size": True}])
def test_cpu_defaults_must_be_positive_integers(given):
    name = next(iter(given))
    with pytest.raises(ValueError, match=f"CPUDefaults.{name} must be a positive integer"):
        CPUDefaults(**given)


def test_recipes_show_prints_the_defaults_and_names_the_cpu_ones(tmp_path):
    shown = runner.invoke(app, ["recipes", "show", "esm2-8m"])
    assert shown.exit_code == 0
    config = json.loads(shown.stdout)  # stdout stays a valid --config
    assert (config["max_steps"], config["global_batch_size"]) == (esm2_8m().defaults.max_steps, None)
    assert config["global_batch_tokens"] == 256 * 1026  # on GPUs: batches cut by tokens, 256 full-length sequences
    on_cpus = json.loads(runner.invoke(app, ["recipes", "show", "esm2-8m", "--cpu"]).stdout)
    assert (on_cpus["global_batch_size"], on_cpus["global_batch_tokens"]) == (32, None)
    assert "Training on CPUs uses max_steps 500, global_batch_size 32, val_check_interval 100" in shown.stderr
    on_cpu = runner.invoke(app, ["recipes", "show", "esm2-8m", "--cpu"])
    assert on_cpu.exit_code == 0
    assert on_cpu.stderr == ""
    path = tmp_path / "cpu.json"
    path.write_text(on_cpu.stdout)
    settings = RunSettings.resolve(path, {})
    assert (settings.max_steps, settings.global_batch_size, settings.val_check_interval) == (500, 32, 100)
    assert runner.invoke(app, ["recipes", "show", "esm2-gpu"]).stderr == ""  # no CPU defaults: nothing to say


def test_a_cpu_training_run_uses_and_reports_the_cpu_defaults_and_its_speed(tmp_path, capsys):
    from bionemo.esm2.recipes.train import train

    recipe = demo()
    defaults = dataclasses.replace(
        recipe.defaults, max_steps=10_000, cpu=CPUDefaults(max_steps=7, global_batch_size=8, val_check_interval=7)
    )
    rows = dict(train(RunSettings(output_dir=tmp_path, accelerator="cpu"), defaults=defaults, recipe=recipe.name))
    printed = capsys.readouterr().out
    assert (
        "Training 7 steps x 8 sequences per step (recipe esm2-demo's defaults for CPUs: --max-steps 7, "
        "--global-batch-size 8, --val-check-interval 7)"
    ) in printed
    assert re.search(r"^about [0-9.]+ steps/s: 7 steps in about \d+ s$", printed, re.MULTILINE), printed
    assert rows["steps"] == "7"
    assert rows["batch"].startswith("8 per step: micro-batch 8 x 1 x 1")
    saved = yaml.safe_load((tmp_path / "settings.yaml").read_text())
    assert [saved[name] for name in RUN_LENGTH] == [7, 8, 8, 7]
