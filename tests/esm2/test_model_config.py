"""The ESM2Config a run builds from its settings: parallel layout and precision."""

import pytest
import torch

from bionemo.esm2.recipes import demo
from bionemo.esm2.recipes.model_settings import model_config
from bionemo.recipes.settings import Precision, RunSettings, StrategyChoice


@pytest.mark.parametrize(("precision", "dtype"), [(Precision.BF16, torch.bfloat16), (Precision.FP32, torch.float32)])
def test_pipeline_stages_exchange_activations_in_the_parameters_type(precision, dtype):
    settings = RunSettings(strategy=StrategyChoice.MEGATRON, devices=2, pipeline_parallel=2, precision=precision)
    config = model_config(demo().defaults.model, settings, training=False)
    assert config.pipeline_model_parallel_size == 2
    assert config.params_dtype == dtype
    assert config.pipeline_dtype == dtype
    assert config.variable_seq_lengths, "batches are padded to their longest sequence, not to seq_length"
