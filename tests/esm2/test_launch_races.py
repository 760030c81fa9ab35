"""Launchers start ranks at once: none reads a demo file another is writing; the file is written atomically."""

import multiprocessing
from pathlib import Path

from bionemo.esm2.data.demo import demo_families, write_fasta
from bionemo.esm2.recipes import demo
from bionemo.esm2.recipes import train as train_module
from bionemo.recipes.settings import RunSettings


def _rewrite(path: str, times: int) -> None:
    records = demo_families(seed=0)[0]
    for _ in range(times):
        write_fasta(records, path)


def test_concurrent_writers_never_expose_a_partial_file(tmp_path):
    path = tmp_path / "demo.fasta"
    _rewrite(str(path), 1)
    whole = path.read_text()
    context = multiprocessing.get_context("fork")  # the writers only run Python
    writers = [context.Process(target=_rewrite, args=(str(path), 200)) for _ in range(3)]
    for writer in writers:
        writer.start()
    reads = 0
    while any(writer.is_alive() for writer in writers) or reads < 50:
        assert path.read_text() == whole  # each writer's truncate-then-write would show here
        reads += 1
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.fasta"]  # no temporary files left


def _records_seen_by_rank(tmp_path: Path, monkeypatch, **environment: str) -> tuple[list, list]:
    for name in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "RANK", "SLURM_PROCID", "SLURM_LOCALID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    seen = {}

    def fit(settings, defaults, recipe, split, out, start, steps, resume_from):
        seen["records"] = split

    monkeypatch.setattr(train_module, "_fit", fit)
    settings = RunSettings(output_dir=tmp_path / "run", accelerator="cpu")  # pyright: ignore[reportArgumentType]
    demo().train(settings)
    return seen["records"]


def test_a_torchrun_rank_started_before_the_file_exists_trains_on_the_demo_records(tmp_path, monkeypatch):
    records = _records_seen_by_rank(tmp_path, monkeypatch, LOCAL_RANK="1", RANK="1")
    assert records == train_module.split_records(demo_families(seed=0)[0], 0)
    assert not (tmp_path / "run" / "data" / "demo_train.fasta").exists()  # local rank 0 writes it


def test_slurm_tasks_without_local_rank_write_the_same_whole_file(tmp_path, monkeypatch):
    first = _records_seen_by_rank(tmp_path, monkeypatch, SLURM_PROCID="0", SLURM_LOCALID="0")
    second = _records_seen_by_rank(tmp_path, monkeypatch, SLURM_PROCID="1", SLURM_LOCALID="1")
    assert first == second == train_module.split_records(demo_families(seed=0)[0], 0)
    fasta = tmp_path / "run" / "data" / "demo_train.fasta"
    assert fasta.read_text().count(">") == len(first[0]) + len(first[1])
