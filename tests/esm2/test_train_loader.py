"""Training batches are prepared by worker processes into page-locked memory on GPUs, in the main process on CPUs."""

import pytest

from bionemo.esm2.data.readers import SequenceRecord
from bionemo.esm2.recipes import gpu, train
from bionemo.recipes.settings import RunSettings


@pytest.mark.parametrize(("chosen", "workers", "pinned"), [("cpu", 0, False), ("gpu", train.TRAIN_WORKERS, True)])
def test_loader_options_follow_the_accelerator(chosen, workers, pinned):
    records = [SequenceRecord(f"s{i}", "MKTAYIAKQR") for i in range(8)]
    settings = RunSettings(accelerator=chosen)  # pyright: ignore[reportArgumentType]
    data = train._data(settings, gpu().defaults, records[:6], records[6:], max_steps=2)
    assert (data.num_workers, data.pin_memory) == (workers, pinned)
    assert train.TRAIN_WORKERS > 0
