"""Test set-up shared by every tier: megatron import on GPU-less machines, GPU markers, hypothesis profile."""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

from bionemo.core.megatron_env import prepare_megatron_import

prepare_megatron_import()

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip GPU tiers where the GPUs they need are missing."""
    gpus = torch.cuda.device_count()
    for item in items:
        if "multi_gpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2 CUDA GPUs, found {gpus}"))
        elif "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
