"""The MegatronStrategy a GPU run gets from its settings (NeMo's classes recorded, nothing started)."""

import pytest
import torch

from bionemo.recipes.settings import RunSettings, StrategyChoice
from bionemo.recipes.trainers import megatron_trainer


@pytest.mark.parametrize(
    ("precision", "dtype"), [("32", torch.float32), ("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)]
)
def test_pipeline_stages_exchange_activations_in_the_precisions_type(monkeypatch, precision, dtype):
    """NeMo copies the strategy's pipeline_dtype onto the model config; None (fp32, no plugin) fails for PP > 1."""
    from nemo import lightning as nl

    made: dict[str, dict] = {}
    monkeypatch.setattr(nl, "MegatronStrategy", lambda **kwargs: made.setdefault("strategy", kwargs))
    monkeypatch.setattr(nl, "MegatronMixedPrecision", lambda **kwargs: made.setdefault("plugin", kwargs))
    monkeypatch.setattr(nl, "Trainer", lambda **kwargs: made.setdefault("trainer", kwargs))
    settings = RunSettings(strategy=StrategyChoice.MEGATRON, devices=2, pipeline_parallel=2)
    megatron_trainer(settings, training=True, precision=precision, common={})
    assert made["strategy"]["pipeline_model_parallel_size"] == 2
    assert made["strategy"]["pipeline_dtype"] == dtype
