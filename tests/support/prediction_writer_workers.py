"""A :class:`PredictionWriter` run over real gloo ranks, for ``tests/callbacks/test_prediction_writer.py``."""

import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from bionemo.callbacks import PredictionWriter, prediction_files
from bionemo.losses import ParallelGroups


class _GlooStrategy:
    """The part of a Lightning strategy the writer uses: a barrier over the default process group."""

    def barrier(self, name: str | None = None) -> None:
        dist.barrier()


def slow_rank_worker(rank: int, world_size: int, output_dir: str) -> None:
    """Rank 0 predicts at once; rank 1 starts once rank 0 has written a file, or after 3 s (it waits at the barrier).

    Each rank writes the samples ``2 * rank`` and ``2 * rank + 1`` (``embeddings`` ``[b, 2]`` hold the index).
    """
    folder = Path(output_dir)
    if rank == 1:
        deadline = time.monotonic() + 3.0
        while not prediction_files(folder, rank=0) and time.monotonic() < deadline:
            time.sleep(0.01)
    trainer = SimpleNamespace(global_rank=rank, strategy=_GlooStrategy())
    writer = PredictionWriter(folder, "batch", groups=ParallelGroups())
    writer.on_predict_start(trainer, None)  # pyright: ignore[reportArgumentType]
    for i in range(2):
        index = torch.tensor([2 * rank + i])
        batch = {"sample_index": index, "embeddings": index.float().view(-1, 1).repeat(1, 2)}
        writer.on_predict_batch_end(trainer, None, batch, None, i)  # pyright: ignore[reportArgumentType]
    writer.on_predict_epoch_end(trainer, None)  # pyright: ignore[reportArgumentType]
    dist.barrier()
