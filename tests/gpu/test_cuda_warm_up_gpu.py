"""The CUDA warm-up's work runs on a GPU in each dtype a prediction computes in, and the thread finishes."""

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_first_cuda_work_runs(dtype):
    from bionemo.recipes.cuda_warm_up import first_cuda_work

    first_cuda_work(dtype)  # raises if any of its operators fails here


def test_the_thread_runs_and_finishes(monkeypatch):
    import bionemo.recipes.cuda_warm_up as warm_up

    monkeypatch.setattr(warm_up, "_thread", None)
    for name in ("LOCAL_RANK", "WORLD_SIZE", "SLURM_NTASKS", warm_up.SWITCH):
        monkeypatch.delenv(name, raising=False)
    assert warm_up.start_cuda_warm_up(torch.bfloat16, devices=1, num_nodes=1) is True
    warm_up.finish_cuda_warm_up()
    assert warm_up._thread is not None
    assert not warm_up._thread.is_alive()
    assert torch.cuda.is_initialized()
