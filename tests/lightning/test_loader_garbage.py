"""MegatronDataModule collects garbage before its loaders fork workers once CUDA is initialized: a CUDA tensor
left in a reference cycle (from ``fit`` in the same process) and freed in a forked worker kills that worker."""

import gc
import weakref

import pytest
import torch

from bionemo.lightning import MegatronDataModule


class Cycle:
    """An object in a reference cycle: only the garbage collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def no_automatic_gc():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize(("workers", "cuda", "collected"), [(2, True, True), (0, True, False), (2, False, False)])
def test_garbage_is_collected_before_forking_workers_with_cuda(no_automatic_gc, monkeypatch, workers, cuda, collected):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda)
    data = MegatronDataModule(predict=list(range(8)), micro_batch_size=2, seq_length=4, num_workers=workers)
    garbage = Cycle()
    freed = weakref.finalize(garbage, lambda: None)
    del garbage
    data.predict_dataloader()
    assert freed.alive is not collected
