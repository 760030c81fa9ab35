"""What a training run resolves before it starts: batch sizes for its layout, its precision, and settings.yaml."""

import pytest
import yaml

from bionemo.recipes.registry import RecipeDefaults
from bionemo.recipes.resolved import resolved_training_settings, save_settings
from bionemo.recipes.settings import Precision, RunSettings, SettingsError

DEFAULTS = RecipeDefaults(
    micro_batch_size=16, global_batch_size=64, max_steps=10, val_check_interval=5, lr=1e-3, precision=Precision.BF16
)


@pytest.mark.parametrize(
    ("given", "micro", "global_batch"),
    [
        ({}, 16, 64),
        ({"devices": 2}, 16, 64),  # 2 micro-batches of 16 per rank and step
        ({"devices": 8}, 8, 64),  # the recipe's micro-batch would exceed the global batch: the largest that fits
        ({"devices": 3}, None, None),  # 64 samples cannot be shared by 3 ranks
        ({"micro_batch_size": 4}, 4, 64),
        ({"global_batch_size": 24}, 12, 24),
        ({"devices": 4, "tensor_parallel": 2, "strategy": "megatron"}, 16, 64),  # 2 data-parallel ranks
    ],
)
def test_batch_sizes_for_the_layout(given, micro, global_batch):
    settings = RunSettings(**given)
    if micro is None:
        with pytest.raises(SettingsError, match="recipe esm2-demo's batch sizes on 3 data-parallel rank"):
            resolved_training_settings(settings, DEFAULTS, gpu=False)
        return
    resolved = resolved_training_settings(settings, DEFAULTS, gpu=False)
    assert (resolved.micro_batch_size, resolved.global_batch_size) == (micro, global_batch)


def test_given_inconsistent_sizes_name_the_option_and_valid_values():
    with pytest.raises(SettingsError) as refused:
        resolved_training_settings(RunSettings(micro_batch_size=16, global_batch_size=40), DEFAULTS, gpu=False)
    assert refused.value.option == "--micro-batch-size"
    assert "--micro-batch-size 16 and --global-batch-size 40" in str(refused.value)
    assert "valid global batch sizes: 16, 32, 48" in str(refused.value)


@pytest.mark.parametrize(
    ("given", "gpu", "expected"),
    [
        (None, True, Precision.BF16),  # GPUs: the recipe's
        (None, False, Precision.FP32),  # CPUs stay fp32
        (Precision.FP32, True, Precision.FP32),
        (Precision.BF16, False, Precision.BF16),
    ],
)
def test_precision_defaults_to_the_recipes_on_gpus(given, gpu, expected):
    assert resolved_training_settings(RunSettings(precision=given), DEFAULTS, gpu=gpu).precision == expected


def test_saved_settings_rerun_as_config(tmp_path):
    resolved = resolved_training_settings(RunSettings(devices=2, seed=3, output_dir=tmp_path), DEFAULTS, gpu=True)
    path = save_settings(resolved, tmp_path, training=True)
    values = yaml.safe_load(path.read_text())
    assert "include" not in values  # prediction options are not a training run's
    assert values["precision"] == "bf16-mixed"
    again = RunSettings.resolve(path, {})
    assert again == resolved
    # a run started with --no-resume: its settings continue it (the flag is how that invocation started)
    save_settings(resolved.model_copy(update={"resume": False}), tmp_path, training=True)
    assert RunSettings.resolve(path, {}) == resolved
