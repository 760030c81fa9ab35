"""Training batches are prepared by worker processes into page-locked memory on GPUs, in the main process on CPUs."""

import pytest

from bionemo.esm2.data.readers import SequenceRecord
from bionemo.esm2.recipes import gpu, train
from bionemo.esm2.recipes.token_steps import TokenSteps
from bionemo.recipes.settings import RunSettings


@pytest.mark.parametrize("by_tokens", [False, True])
@pytest.mark.parametrize(("chosen", "workers", "pinned"), [("cpu", 0, False), ("gpu", train.TRAIN_WORKERS, True)])
def test_loader_options_follow_the_accelerator(chosen, workers, pinned, by_tokens):
    records = [SequenceRecord(f"s{i}", "MKTAYIAKQR") for i in range(8)]
    settings = RunSettings(accelerator=chosen)  # pyright: ignore[reportArgumentType]
    steps = TokenSteps(budget=48, micro_tokens=24, data_parallel=1) if by_tokens else None
    data = train.training_data(settings, gpu().defaults, records[:6], records[6:], max_steps=2, steps=steps)
    assert (data.num_workers, data.pin_memory) == (workers, pinned)
    assert train.TRAIN_WORKERS > 0
    if by_tokens:  # two micro-batches per step; the 6 sequences of 12 tokens make one pass of two steps
        assert (data.micro_batch_size, data.requested_global_batch_size) == (1, 2)
        items = [data.datasets["train"][item] for item in range(4)]
        assert all(items)
        assert sorted(int(s["sample_index"]) for item in items for s in item) == list(range(6))
