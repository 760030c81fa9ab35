"""CUDA's start-up work in a background thread, only for one GPU of one node without a launcher.

(bionemo.recipes.cuda_warm_up; its effect on start-up is measured on GPUs: docs/benchmarks.md#prediction-start-up)
"""

import pytest
import torch

import bionemo.recipes.cuda_warm_up as warm_up

LAUNCHERS = ("LOCAL_RANK", "WORLD_SIZE", "SLURM_NTASKS", warm_up.SWITCH)


@pytest.fixture
def fresh(monkeypatch):
    """No thread from an earlier test, no launcher variables, CUDA reported available (nothing runs on it)."""
    monkeypatch.setattr(warm_up, "_thread", None)
    for name in LAUNCHERS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    started = []
    monkeypatch.setattr(warm_up, "_warm_up", started.append)
    return started


@pytest.mark.parametrize(
    ("environment", "devices", "num_nodes"),
    [
        ({warm_up.SWITCH: "0"}, 1, 1),
        ({}, 2, 1),
        ({}, 1, 2),
        ({"LOCAL_RANK": "0"}, 1, 1),
        ({"WORLD_SIZE": "2"}, 1, 1),
        ({"SLURM_NTASKS": "4"}, 1, 1),
    ],
)
def test_it_does_not_start_off_one_gpu_or_under_a_launcher(fresh, monkeypatch, environment, devices, num_nodes):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert warm_up.start_cuda_warm_up(torch.bfloat16, devices=devices, num_nodes=num_nodes) is False
    warm_up.finish_cuda_warm_up()  # nothing to wait for
    assert fresh == []


def test_one_gpu_starts_one_thread_in_the_runs_dtype(fresh, monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS", "1")  # one task of a SLURM job is still one process
    assert warm_up.start_cuda_warm_up(torch.float16, devices=1, num_nodes=1) is True
    assert warm_up.start_cuda_warm_up(torch.float16, devices=1, num_nodes=1) is True  # the same thread
    warm_up.finish_cuda_warm_up()
    assert fresh == [torch.float16]
    assert warm_up._thread is not None
    assert not warm_up._thread.is_alive()


def test_without_cuda_nothing_starts(fresh, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert warm_up.start_cuda_warm_up(torch.bfloat16, devices=1, num_nodes=1) is False
    assert fresh == []


def test_a_failing_warm_up_is_silent(monkeypatch):
    """The command's own first CUDA call reports the problem, not the background thread."""

    def fail(dtype):
        raise RuntimeError("CUDA error: no kernel image is available")

    monkeypatch.setattr(warm_up, "first_cuda_work", fail)
    warm_up._warm_up(torch.bfloat16)
