"""Test set-up shared by every tier: megatron import, GPU markers (the CPU tier hides GPUs), hypothesis profile."""

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


@pytest.fixture(autouse=True)
def _cpu_tier_runs_on_the_cpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests without a GPU marker run on the CPU also on a machine with GPUs.

    ``bionemo run`` picks its accelerator through ``bionemo.core.cuda_devices``, which reads
    ``CUDA_VISIBLE_DEVICES`` first, and child processes inherit it: hiding the GPUs keeps in-process CLI runs
    and the runs these tests start on the CPU, whatever torch has already seen.
    """
    if "gpu" not in request.keywords and "multi_gpu" not in request.keywords:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
