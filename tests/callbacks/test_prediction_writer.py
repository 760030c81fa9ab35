import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import bionemo.core.safetensors_io as writer_module
from bionemo.callbacks import PredictionWriter, merge_predictions, prediction_files
from bionemo.losses import ParallelGroups
from support.distributed import run_distributed
from support.prediction_writer_workers import slow_rank_worker

SINGLE = ParallelGroups()


class ThreadRanks:
    """A strategy stand-in whose ``barrier`` waits for every rank of a run, each rank a thread."""

    def __init__(self, world_size: int) -> None:
        self._barrier = threading.Barrier(world_size)
        self.barriers: list[str | None] = []

    def barrier(self, name: str | None = None) -> None:
        self.barriers.append(name)
        self._barrier.wait(timeout=30)


def trainer(rank: int = 0, strategy: ThreadRanks | None = None):
    return SimpleNamespace(global_rank=rank, strategy=strategy or ThreadRanks(1))


def prediction(indices, seq=3, vocab=4):
    index = torch.tensor(indices)
    # logits [s, b, v] whose values encode the sample index, so order can be checked
    logits = index.float().view(1, -1, 1).expand(seq, -1, vocab).clone()
    return {"token_logits": logits, "sample_index": index, "embeddings": index.float().view(-1, 1).repeat(1, 2)}


def run_writer(writer, rank, batches):
    run_ranks([(writer, rank, batches)])


def predict_on_rank(writer, trainer_, batches) -> None:
    """What ``trainer.predict`` calls on one rank: start, every batch's end, the epoch's end."""
    writer.on_predict_start(trainer_, None)
    for i, batch in enumerate(batches):
        writer.on_predict_batch_end(trainer_, None, batch, None, i)
    writer.on_predict_epoch_end(trainer_, None)


def run_ranks(runs):
    """Ranks of one run, each in its own thread, meeting at the writer's own barriers only."""
    strategy = ThreadRanks(len(runs))
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = [pool.submit(predict_on_rank, writer, trainer(rank, strategy), batch) for writer, rank, batch in runs]
        for future in futures:
            future.result()


def test_batch_interval_writes_one_file_per_batch(tmp_path):
    writer = PredictionWriter(tmp_path, "batch", groups=SINGLE)
    run_writer(writer, 0, [prediction([0, 1]), prediction([2])])
    assert [p.name for p in prediction_files(tmp_path)] == [
        "predictions_rank0_batch0.safetensors",
        "predictions_rank0_batch1.safetensors",
    ]
    loaded = load_file(tmp_path / "predictions_rank0_batch1.safetensors")
    assert loaded["sample_index"].tolist() == [2]


def test_ranks_merge_back_into_input_order_without_duplicates(tmp_path):
    # Two data-parallel ranks took interleaved shards; the distributed sampler repeated sample 0 to even them out.
    run_ranks(
        [
            (PredictionWriter(tmp_path, "epoch", groups=SINGLE), 0, [prediction([0, 1]), prediction([4])]),
            (PredictionWriter(tmp_path, "epoch", groups=SINGLE), 1, [prediction([2, 3]), prediction([0])]),
        ]
    )
    merged = merge_predictions(tmp_path)
    assert merged["sample_index"].tolist() == [0, 1, 2, 3, 4]
    assert merged["token_logits"].shape == (3, 5, 4)
    assert merged["token_logits"][0, :, 0].tolist() == [0, 1, 2, 3, 4]  # batch dim 1 for token_logits
    assert merged["embeddings"][:, 0].tolist() == [0, 1, 2, 3, 4]


def test_ragged_sequences_are_padded_on_merge(tmp_path):
    run_writer(PredictionWriter(tmp_path, "batch", groups=SINGLE), 0, [prediction([1], seq=2), prediction([0], seq=5)])
    merged = merge_predictions(tmp_path)
    assert merged["token_logits"].shape == (5, 2, 4)
    assert merged["token_logits"][2:, 1].eq(0).all()  # sample 1 (seq 2) padded with zeros


def test_ranks_without_the_full_output_write_nothing(tmp_path):
    for groups in (ParallelGroups(is_last_stage=False),):
        run_writer(PredictionWriter(tmp_path, "batch", groups=groups), 0, [prediction([0])])
    assert prediction_files(tmp_path) == []


def test_existing_predictions_are_refused_unless_overwrite(tmp_path):
    run_writer(PredictionWriter(tmp_path, "epoch", groups=SINGLE), 0, [prediction([0])])
    with pytest.raises(FileExistsError, match="already holds predictions"):
        PredictionWriter(tmp_path, groups=SINGLE).on_predict_start(trainer(0), None)
    # Another rank's files block too: they would be merged with this run's.
    with pytest.raises(FileExistsError, match="already holds predictions"):
        PredictionWriter(tmp_path, groups=SINGLE).on_predict_start(trainer(1), None)
    run_writer(PredictionWriter(tmp_path, "epoch", overwrite=True, groups=SINGLE), 0, [prediction([7])])
    assert merge_predictions(tmp_path)["sample_index"].tolist() == [7]


def test_overwrite_removes_every_ranks_earlier_shards(tmp_path):
    """After a 2-rank run, a 1-rank rerun with overwrite=True merges its own rows only (no stale rank-1 rows)."""
    run_ranks(
        [
            (PredictionWriter(tmp_path, "epoch", groups=SINGLE), 0, [prediction([0, 2])]),
            (PredictionWriter(tmp_path, "batch", groups=SINGLE), 1, [prediction([1, 3])]),
        ]
    )
    assert len(prediction_files(tmp_path)) == 2
    run_writer(PredictionWriter(tmp_path, "epoch", overwrite=True, groups=SINGLE), 0, [prediction([0, 1, 2])])
    assert merge_predictions(tmp_path)["sample_index"].tolist() == [0, 1, 2]


def test_bad_outputs_name_what_is_wrong(tmp_path):
    writer = PredictionWriter(tmp_path, "batch", groups=SINGLE)
    writer.on_predict_start(trainer(), None)
    with pytest.raises(TypeError, match="flat dicts of tensors; got Tensor"):
        writer.on_predict_batch_end(trainer(), None, torch.zeros(2), None, 0)
    with pytest.raises(TypeError, match=r"got dict with keys \['nested'\]"):
        writer.on_predict_batch_end(trainer(), None, {"nested": {"a": torch.zeros(1)}}, None, 0)
    with pytest.raises(KeyError, match=r"no 'sample_index'.*keys are \['token_logits'\]"):
        writer.on_predict_batch_end(trainer(), None, {"token_logits": torch.zeros(1, 1, 1)}, None, 0)
    with pytest.raises(ValueError, match=r"write_interval='sometimes' is not valid; use one of \['batch', 'epoch'\]"):
        PredictionWriter(tmp_path, "sometimes")
    assert prediction_files(tmp_path) == []


def test_none_outputs_are_skipped(tmp_path):
    run_writer(PredictionWriter(tmp_path, "batch", groups=SINGLE), 0, [None, prediction([3])])
    assert [p.name for p in prediction_files(tmp_path)] == ["predictions_rank0_batch1.safetensors"]


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    def broken_save(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(writer_module, "save_file", broken_save)
    writer = PredictionWriter(tmp_path, "batch", groups=SINGLE)
    writer.on_predict_start(trainer(), None)
    writer.on_predict_batch_end(trainer(), None, prediction([0]), None, 0)
    with pytest.raises(OSError, match="disk full"):
        writer.on_predict_epoch_end(trainer(), None)  # the last batch is written at the epoch's end
    assert list(tmp_path.iterdir()) == []


def test_merge_of_an_empty_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="No predictions_rank"):
        merge_predictions(tmp_path)


def test_a_batch_is_written_once_the_next_has_ended_and_the_last_at_epoch_end(tmp_path):
    """The device-to-host copy of batch N completes while the host queues batch N+1: no wait at a batch's end."""
    writer = PredictionWriter(tmp_path, "batch", groups=SINGLE)
    writer.on_predict_start(trainer(), None)
    written = []
    for i, batch in enumerate([prediction([0, 1]), prediction([2]), prediction([3])]):
        writer.on_predict_batch_end(trainer(), None, batch, None, i)
        written.append([p.name for p in prediction_files(tmp_path)])
    writer.on_predict_epoch_end(trainer(), None)
    assert written == [[], ["predictions_rank0_batch0.safetensors"],
                       ["predictions_rank0_batch0.safetensors", "predictions_rank0_batch1.safetensors"]]  # fmt: skip
    assert len(prediction_files(tmp_path)) == 3
    assert load_file(tmp_path / "predictions_rank0_batch2.safetensors")["sample_index"].tolist() == [3]


@pytest.mark.gpu
def test_cuda_outputs_are_copied_without_blocking_and_written_intact(tmp_path):
    writer = PredictionWriter(tmp_path, "epoch", groups=SINGLE)
    host = [prediction(list(range(i * 64, (i + 1) * 64)), seq=512) for i in range(4)]
    batches = [{k: v.cuda() for k, v in batch.items()} for batch in host]
    run_writer(writer, 0, batches)
    merged = merge_predictions(tmp_path)
    assert merged["sample_index"].tolist() == list(range(256))
    torch.testing.assert_close(merged["embeddings"][:, 0], torch.arange(256).float())


@pytest.mark.parametrize(("overwrite", "slow_rank"), [(False, 1), (True, 0)])
def test_a_slow_rank_never_takes_a_fast_ranks_new_file_for_an_earlier_one(tmp_path, overwrite, slow_rank):
    """The fast rank would write before the slow one looks at the folder, but for the writer's barrier.

    Without it the slow rank either refuses to start (the fast rank's file looks like an earlier prediction) or,
    as rank 0 with ``overwrite``, removes the fast rank's new file.
    """
    strategy = ThreadRanks(2)
    fast_rank = 1 - slow_rank
    wrote = threading.Event()

    def fast() -> None:
        writer = PredictionWriter(tmp_path, "batch", overwrite=overwrite, groups=SINGLE)
        predict_on_rank(writer, trainer(fast_rank, strategy), [prediction([fast_rank])])
        wrote.set()

    def slow() -> None:
        wrote.wait(timeout=1.0)  # with the barrier the fast rank waits for this rank: the wait times out
        writer = PredictionWriter(tmp_path, "batch", overwrite=overwrite, groups=SINGLE)
        predict_on_rank(writer, trainer(slow_rank, strategy), [prediction([slow_rank])])

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(fast), pool.submit(slow)]
        for future in futures:
            future.result()
    assert len(strategy.barriers) == 2  # one per rank
    assert [p.name for p in prediction_files(tmp_path)] == [
        "predictions_rank0_batch0.safetensors",
        "predictions_rank1_batch0.safetensors",
    ]
    assert merge_predictions(tmp_path)["sample_index"].tolist() == [0, 1]


@pytest.mark.multiprocess
def test_two_gloo_ranks_start_in_a_folder_one_of_them_is_slow_to_reach(tmp_path):
    """Two real processes: rank 1 reaches ``on_predict_start`` only once rank 0 wrote (or after 3 s)."""
    results = run_distributed(slow_rank_worker, 2, str(tmp_path))
    assert results == [None, None]
    merged = merge_predictions(tmp_path)
    assert merged["sample_index"].tolist() == [0, 1, 2, 3]
    torch.testing.assert_close(merged["embeddings"][:, 0], torch.arange(4).float())
