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


def _needs_a_gpu(item: pytest.Item) -> bool:
    return "gpu" in item.keywords or "multi_gpu" in item.keywords


def pytest_collection_finish(session: pytest.Session) -> None:
    """Fix what this process's torch sees of the GPUs before any test runs.

    A session of CPU tests only (``-m "not gpu and not multi_gpu"``) hides the GPUs for its whole process: torch,
    Lightning and the children then agree that there are none (hiding them per test, after torch had counted them,
    made Lightning read the CUDA random state of a GPU that CUDA then could not find). A session with GPU tests
    on a machine with GPUs initializes CUDA at once, so the per-test hiding below only reaches child processes
    and the CLI's choice of accelerator, never this process's CUDA state.
    """
    runnable = [item for item in session.items if not item.get_closest_marker("skip")]
    if not any(_needs_a_gpu(item) for item in runnable):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    elif torch.cuda.is_available():
        torch.cuda.init()


@pytest.fixture(autouse=True)
def _cpu_tier_runs_on_the_cpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests without a GPU marker run on the CPU also on a machine with GPUs.

    ``bionemo run`` picks its accelerator through ``bionemo.core.cuda_devices``, which reads
    ``CUDA_VISIBLE_DEVICES`` first, and child processes inherit it: hiding the GPUs keeps in-process CLI runs
    and the runs these tests start on the CPU, whatever torch has already seen.
    """
    if not _needs_a_gpu(request.node):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
