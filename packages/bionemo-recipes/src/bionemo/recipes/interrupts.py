"""Ctrl-C or SIGTERM during training: every rank finishes the same step, saves a checkpoint and exits.

Lightning 2.4 turns SIGTERM into ``SIGTERMException`` on each rank by itself, at the end of whichever step that
rank is in when it notices, and turns SIGINT into a ``KeyboardInterrupt`` wherever the code happens to be (in
the middle of an optimizer step, say). Neither is safe to checkpoint: under DDP or MegatronStrategy the ranks
can stop at different steps (one waits in a collective the others never join), and a state caught mid-step
is half updated. :class:`InterruptCheckpoint` instead only notes the signal, and after each training step the
ranks agree (one max-reduction of the signal number) whether any of them received one; all of them then raise
:class:`TrainingInterrupted` after the same step, and Lightning's own ``on_exception`` path (the one
``OnExceptionCheckpoint`` uses) has every rank take part in saving that step's checkpoint.

:class:`InterruptCheckpoint` is not an ``OnExceptionCheckpoint``: with one among the callbacks, Lightning turns
``fit(ckpt_path=None)`` into ``ckpt_path="last"`` and resumes from the newest checkpoint in its folder, so a run
told to start afresh (``--no-resume``) would continue the previous one.

Wrappers deliver one interrupt more than once: ``uv run`` forwards the SIGINT that ``timeout -s INT`` or a
scheduler sent, and the process group's own copy arrives too, milliseconds apart. Signals within
:data:`DUPLICATE_SIGNAL_WINDOW_S` of the first are that one interrupt; a Ctrl-C after that is the user's second
one and stops at once (:class:`TrainingAborted`), without saving.

The processes Lightning's own launcher started (``--devices 2`` run without torchrun or SLURM) exit 0 after such
a stop, and only the process the user started exits 128 + the signal: that launcher watches its children and
SIGKILLs every process, the user's included, as soon as one of them exits non-zero, which would cut the user's
process short in its save or its report.

Imports Lightning: import this module inside commands, not at ``bionemo --help`` time.
"""

import os
import signal
import threading
from pathlib import Path
from time import monotonic, sleep
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments.lightning import LightningEnvironment
from lightning.pytorch.callbacks import Checkpoint
from typing_extensions import override

__all__ = ["DUPLICATE_SIGNAL_WINDOW_S", "InterruptCheckpoint", "TrainingAborted", "TrainingInterrupted", "aborted_by"]

DUPLICATE_SIGNAL_WINDOW_S = 1.0
"""Seconds after the first SIGINT or SIGTERM during which further ones are copies of it, not a second Ctrl-C."""

_HANDLED = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(SystemExit):
    """Raised on every rank after the training step during which SIGINT or SIGTERM arrived.

    A ``SystemExit`` with code 128 + the signal's number (130 for SIGINT, 143 for SIGTERM): uncaught, the process
    exits with the status a shell reports for a process stopped by that signal. Code 0 in a process that
    Lightning's launcher started (``launched``): see the module's docstring.
    """

    def __init__(
        self, signum: signal.Signals, step: int, *, checkpoint_dir: Path, report: bool, launched: bool = False
    ) -> None:
        """The interruption by ``signum`` after optimizer step ``step``; ``report`` on the rank that tells the user."""
        self.status = 0 if launched else 128 + int(signum)
        """The process's exit status: 128 + the signal's number, or 0 in a process Lightning's launcher started."""
        super().__init__(self.status)
        self.signal = signum
        """The signal received (by at least one rank)."""
        self.step = step
        """Optimizer steps taken: the step the checkpoint holds."""
        self.checkpoint_dir = checkpoint_dir
        """The folder the checkpoint goes to, beside the periodic ones."""
        self.report = report
        """True on global rank zero, the one rank that should print what happened."""
        self.checkpoint: str | None = None
        """The checkpoint saved, once :class:`InterruptCheckpoint` has written it; None if none was."""
        self.save_error: str | None = None
        """Why no checkpoint was saved, if saving failed."""


class TrainingAborted(KeyboardInterrupt):
    """Raised at once, wherever training is, by a second Ctrl-C: nothing is saved.

    A second Ctrl-C is a SIGINT more than :data:`DUPLICATE_SIGNAL_WINDOW_S` after the first signal. A
    ``KeyboardInterrupt``, so Lightning shuts down as it does on Ctrl-C (``on_exception`` hooks, the processes
    its launcher started killed) and then calls ``exit(1)``: the ``SystemExit`` that comes out of ``fit`` has this
    exception as its ``__context__``. :func:`aborted_by` finds it there, or as itself when it was raised during
    the interrupt checkpoint's save (outside Lightning's handling).
    """

    def __init__(self, checkpoint_dir: Path, *, report: bool) -> None:
        """A stop without saving; the periodic checkpoints in ``checkpoint_dir`` are what a rerun resumes from."""
        super().__init__()
        self.checkpoint_dir = checkpoint_dir
        """The folder of the periodic and interrupt checkpoints."""
        self.report = report
        """True on global rank zero, the one rank that should print what happened."""


def aborted_by(error: BaseException) -> TrainingAborted | None:
    """The :class:`TrainingAborted` that ``error`` is, or that was being handled when ``error`` was raised."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, TrainingAborted):
            return cause
        seen.add(id(cause))
        cause = cause.__context__
    return None


def _started_by_lightning(trainer: pl.Trainer) -> bool:
    """True in a process that Lightning's subprocess launcher started: local rank > 0 under its own environment."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    return isinstance(environment, LightningEnvironment) and environment.local_rank() > 0


class InterruptCheckpoint(Checkpoint):
    """On SIGINT or SIGTERM during ``fit``: stop every rank after the same step and save a checkpoint there.

    From ``on_train_start`` to ``on_train_end`` the two signals only set a flag (Lightning's own SIGTERM handler
    is set aside for that time: it would stop each rank on its own). After every training step the ranks
    reduce the flag; once any rank has it, all raise :class:`TrainingInterrupted`, and ``on_exception`` saves
    ``dirpath/filename.ckpt`` through ``trainer.save_checkpoint`` on every rank (a megatron distributed
    checkpoint needs them all). Signals within :data:`DUPLICATE_SIGNAL_WINDOW_S` of the first (on a monotonic
    clock) are copies of it: after the save, ``on_exception`` waits out what is left of that window before it
    gives the signals back to their previous handlers. A Ctrl-C after the window, until the save has finished,
    stops at once by raising :class:`TrainingAborted`, without saving: the state may then be mid-step. Other
    exceptions save nothing for the same reason.

    Put this callback before the ``ModelCheckpoint`` in the callback list: it raises in ``on_train_batch_end``,
    ahead of a periodic save of the same step.
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | Path, filename: str = "last") -> None:
        """Save to ``dirpath/filename.ckpt``; ``{step}`` in ``filename`` becomes the global step (``step{step}``)."""
        super().__init__()
        self.dirpath = dirpath
        """The folder the checkpoint is saved in."""
        self.filename = filename
        """The checkpoint's name without ``FILE_EXTENSION``; ``{step}`` in it becomes the step saved."""
        self._received: signal.Signals | None = None
        self._received_at = 0.0
        self._report = False
        self._step = 0
        self._previous: dict[signal.Signals, Any] = {}

    @property
    def ckpt_path(self) -> str:
        """Where the checkpoint of the step training stopped after goes."""
        return os.path.join(self.dirpath, self.filename.format(step=self._step) + self.FILE_EXTENSION)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._received = None
        self._report = trainer.is_global_zero
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread; the ranks still agree below
        for signum in _HANDLED:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._note)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        received = int(self._received or 0)
        if trainer.world_size > 1:
            # every rank joins this reduction after every step, so all of them stop after the same one
            flag = torch.tensor(received, device=trainer.strategy.root_device)
            received = int(trainer.strategy.reduce(flag, reduce_op="max").item())
        if received:
            self._step = trainer.global_step
            raise TrainingInterrupted(
                signal.Signals(received),
                trainer.global_step,
                checkpoint_dir=Path(self.dirpath),
                report=trainer.is_global_zero,
                launched=_started_by_lightning(trainer),
            )

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        try:
            if isinstance(exception, TrainingInterrupted):
                self._save(trainer, exception)
                # copies of the signal still on their way must find this handler, not Python's KeyboardInterrupt
                sleep(max(0.0, self._received_at + DUPLICATE_SIGNAL_WINDOW_S - monotonic()))
            # otherwise the state may be mid-step: the last periodic checkpoint stays the one to resume from
        finally:
            self._restore()

    def _save(self, trainer: pl.Trainer, exception: TrainingInterrupted) -> None:
        try:
            trainer.save_checkpoint(self.ckpt_path)
        except Exception as error:
            exception.save_error = f"{type(error).__name__}: {error}"
            return
        # MegatronStrategy writes ``name.ckpt`` as the directory ``name``
        saved = self.ckpt_path
        exception.checkpoint = saved if os.path.exists(saved) else os.path.splitext(saved)[0]

    def _note(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: note the first signal, take later ones within the window as copies of it.

        Raises:
            TrainingAborted: On a SIGINT more than :data:`DUPLICATE_SIGNAL_WINDOW_S` after the first signal.
        """
        received = signal.Signals(signum)
        now = monotonic()
        if self._received is None:
            self._received, self._received_at = received, now
            if self._report:
                # os.write: print() could re-enter a write the signal interrupted
                message = (
                    f"\n{received.name} received: saving a checkpoint after this step "
                    "(Ctrl-C again: stop now, without saving)\n"
                )
                os.write(2, message.encode())
            return
        if received == signal.SIGINT and now - self._received_at > DUPLICATE_SIGNAL_WINDOW_S:
            raise TrainingAborted(Path(self.dirpath), report=self._report)  # a second Ctrl-C: stop now
        self._received = max(self._received, received)  # SIGTERM wins over SIGINT: the process is expected to go

    def _restore(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self._previous.items():
                if handler is not None:
                    signal.signal(signum, handler)
        self._previous = {}
