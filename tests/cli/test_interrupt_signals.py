"""InterruptCheckpoint's signal handler on a fake monotonic clock: copies of one signal within
DUPLICATE_SIGNAL_WINDOW_S are one interrupt, a later Ctrl-C stops at once without saving, and the line
`bionemo run train` prints then names the checkpoint a rerun resumes from."""

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.fabric.plugins.environments.lightning import LightningEnvironment
from lightning.fabric.plugins.environments.torchelastic import TorchElasticEnvironment
from typer.testing import CliRunner

import bionemo.recipes.registry as registry
from bionemo.cli.app import app
from bionemo.recipes import interrupts
from bionemo.recipes.interrupts import (
    DUPLICATE_SIGNAL_WINDOW_S,
    InterruptCheckpoint,
    TrainingAborted,
    TrainingInterrupted,
    aborted_by,
)
from support.step_hook import StepHook
from support.trainers import cpu_trainer

LATER = DUPLICATE_SIGNAL_WINDOW_S + 0.5
"""Seconds between the user's first and second Ctrl-C."""


class FakeClock:
    """``time.monotonic`` that moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(interrupts, "monotonic", fake)
    return fake


@pytest.fixture
def handler(tmp_path: Path) -> Iterator[InterruptCheckpoint]:
    """The callback with its signal handlers installed (as at the start of ``fit``); removed after the test."""
    callback = InterruptCheckpoint(tmp_path)
    trainer: Any = SimpleNamespace(is_global_zero=True)
    callback.on_train_start(trainer, pl.LightningModule())
    try:
        yield callback
    finally:
        callback.on_train_end(trainer, pl.LightningModule())


def stopped_after_step(
    callback: InterruptCheckpoint, step: int = 7, environment: Any = None
) -> TrainingInterrupted | None:
    """What the callback raises at the end of training step ``step`` of a one-process run in ``environment``."""
    strategy = SimpleNamespace(cluster_environment=environment or LightningEnvironment())
    trainer: Any = SimpleNamespace(world_size=1, global_step=step, is_global_zero=True, strategy=strategy)
    try:
        callback.on_train_batch_end(trainer, pl.LightningModule(), None, None, 0)
    except TrainingInterrupted as stop:
        return stop
    return None


def test_copies_of_one_ctrl_c_within_the_window_are_one_interrupt(clock, handler, tmp_path):
    signal.raise_signal(signal.SIGINT)
    clock.now += 0.005  # `uv run` forwards the SIGINT; the process group's copy arrives too
    signal.raise_signal(signal.SIGINT)
    clock.now += DUPLICATE_SIGNAL_WINDOW_S * 0.9
    signal.raise_signal(signal.SIGINT)
    stop = stopped_after_step(handler)
    assert stop is not None
    assert (stop.signal, stop.step, stop.code, stop.checkpoint_dir) == (signal.SIGINT, 7, 130, tmp_path)


def test_a_ctrl_c_after_the_window_stops_at_once(clock, handler, tmp_path):
    signal.raise_signal(signal.SIGINT)
    clock.now += LATER
    with pytest.raises(TrainingAborted) as aborted:
        signal.raise_signal(signal.SIGINT)
    assert (aborted.value.checkpoint_dir, aborted.value.report) == (tmp_path, True)


def test_sigterm_is_never_a_second_ctrl_c_and_wins_over_sigint(clock, handler):
    signal.raise_signal(signal.SIGINT)
    signal.raise_signal(signal.SIGTERM)
    clock.now += LATER
    signal.raise_signal(signal.SIGTERM)  # a scheduler repeating itself
    stop = stopped_after_step(handler)
    assert stop is not None
    assert (stop.signal, stop.code) == (signal.SIGTERM, 143)


@pytest.mark.parametrize(
    ("environment", "local_rank", "status"),
    [(LightningEnvironment, "1", 0), (LightningEnvironment, "0", 143), (TorchElasticEnvironment, "1", 143)],
)
def test_only_the_processes_lightnings_launcher_started_exit_0(handler, monkeypatch, environment, local_rank, status):
    # its observer SIGKILLs the user's process when one of them exits non-zero, before that one has reported
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    for name, value in {"WORLD_SIZE": "2", "RANK": local_rank, "GROUP_RANK": "0", "TORCHELASTIC_RUN_ID": "x"}.items():
        monkeypatch.setenv(name, value)
    signal.raise_signal(signal.SIGTERM)
    stop = stopped_after_step(handler, environment=environment())
    assert stop is not None
    assert (stop.signal, stop.status, stop.code) == (signal.SIGTERM, status, status)


def test_nothing_received_nothing_stops(handler):
    assert stopped_after_step(handler) is None


def fit_with_two_ctrl_c(clock: FakeClock, checkpoints: Path) -> None:
    """``fit`` with an InterruptCheckpoint, the user pressing Ctrl-C twice, a second apart, in step 2."""

    def ctrl_c_twice(batch_idx: int) -> None:
        if batch_idx == 2:
            signal.raise_signal(signal.SIGINT)
            clock.now += LATER
            signal.raise_signal(signal.SIGINT)

    trainer = cpu_trainer([InterruptCheckpoint(checkpoints)], max_steps=6, enable_checkpointing=True)
    trainer.fit(StepHook(ctrl_c_twice))


def test_lightning_shutdown_keeps_the_abort_and_saves_nothing(clock, tmp_path):
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as stopped:
        fit_with_two_ctrl_c(clock, tmp_path)
    assert stopped.value.code == 1  # Lightning's exit(1) after its KeyboardInterrupt shutdown
    aborted = aborted_by(stopped.value)
    assert aborted is not None
    assert aborted.checkpoint_dir == tmp_path
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGINT) is before


def _train_with(monkeypatch: pytest.MonkeyPatch, train: Callable[[Any], None]) -> None:
    """``bionemo run train`` runs ``train(settings)`` as its recipe; the command printed starts ``bionemo``."""
    monkeypatch.setattr(registry, "load_recipe", lambda name: SimpleNamespace(train=train))
    for launcher in ("UV_RUN_RECURSION_DEPTH", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(launcher, raising=False)


@pytest.mark.parametrize("periodic", [True, False], ids=["periodic-checkpoint", "none"])
def test_the_cli_says_a_second_ctrl_c_saved_nothing_and_what_a_rerun_resumes(clock, monkeypatch, tmp_path, periodic):
    out = tmp_path / "with space"
    checkpoints = out / "checkpoints"
    if periodic:
        checkpoints.mkdir(parents=True)
        (checkpoints / "last.ckpt").write_bytes(b"the periodic checkpoint")
    _train_with(monkeypatch, lambda settings: fit_with_two_ctrl_c(clock, settings.output_dir / "checkpoints"))
    result = CliRunner().invoke(app, ["run", "train", "--output-dir", str(out), "--no-resume", "--seed", "3"])
    assert result.exit_code == 130, result.output
    command = f"bionemo run train --output-dir '{out}' --seed 3"
    stopped = "Training stopped at once by a second SIGINT; no checkpoint was saved"
    if periodic:
        expected = f"{stopped}. Rerun to resume from {checkpoints / 'last.ckpt'}: {command}"
    else:
        expected = f"{stopped}, and there is none to resume from. Rerun to start afresh: {command}"
    assert result.stderr.strip().splitlines() == [expected]
    assert "Traceback" not in result.output


def test_the_cli_names_the_checkpoint_a_rerun_resumes_when_the_interrupt_save_failed(monkeypatch, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "last.ckpt").write_bytes(b"the periodic checkpoint")

    def save_fails(settings: Any) -> None:
        stop = TrainingInterrupted(signal.SIGTERM, 3, checkpoint_dir=checkpoints, report=True)
        stop.save_error = "OSError: disk full"
        raise stop

    _train_with(monkeypatch, save_fails)
    result = CliRunner().invoke(app, ["run", "train", "--output-dir", str(tmp_path)])
    assert result.exit_code == 143, result.output
    assert result.stderr.strip() == (
        "Training stopped by SIGTERM after step 3; no checkpoint was saved (OSError: disk full). "
        f"Rerun to resume from {checkpoints / 'last.ckpt'}: bionemo run train --output-dir {tmp_path}"
    )
