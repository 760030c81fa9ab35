"""How long a training run will take, said once after its first steps.

For example ``about 0.27 steps/s: 500 steps in about 31 min``.

Imports Lightning: import this module inside commands, not at ``bionemo --help`` time.
"""

import sys
import time
from collections.abc import Callable

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

__all__ = ["DurationEstimate", "format_duration", "format_rate"]


class DurationEstimate(Callback):
    """Prints one line on global rank 0 once ``after_steps`` optimizer steps have been timed: the rate and the time.

    The first ``skip_steps`` steps of a fit (after a resume: of the steps this fit runs) are not timed: they hold
    one-time work (CUDA and Triton kernels compiled, data-loader workers started). The rate is the mean over the
    next ``after_steps`` steps, validation included where it falls in them; the line gives the time of all
    ``trainer.max_steps`` steps at that rate and, after a resume, the time left. Nothing is printed when the fit
    ends before that, or without ``max_steps``.
    """

    def __init__(
        self,
        *,
        after_steps: int = 5,
        skip_steps: int = 1,
        clock: Callable[[], float] = time.monotonic,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        """Time ``after_steps`` steps after the first ``skip_steps``; ``clock`` gives seconds, ``echo`` prints a line.

        Raises:
            ValueError: ``after_steps`` below 1 or ``skip_steps`` below 0.
        """
        if after_steps < 1 or skip_steps < 0:
            raise ValueError(f"after_steps must be >= 1 and skip_steps >= 0, got {after_steps} and {skip_steps}")
        self.after_steps = after_steps
        self.skip_steps = skip_steps
        self.clock = clock
        self.echo = echo or _print
        self._first_step: int | None = None
        self._timed_from: tuple[int, float] | None = None
        self._said = False

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._first_step = trainer.global_step
        self._timed_from = (trainer.global_step, self.clock()) if self.skip_steps == 0 else None
        self._said = False

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: object, batch: object, batch_idx: int
    ) -> None:
        # called once per micro-batch under gradient accumulation: only the optimizer step count matters
        if self._said or self._first_step is None or not trainer.is_global_zero or trainer.max_steps <= 0:
            return
        step = trainer.global_step
        if self._timed_from is None:
            if step - self._first_step >= self.skip_steps:
                self._timed_from = (step, self.clock())
            return
        start_step, start_time = self._timed_from
        if step - start_step < self.after_steps:
            return
        seconds = self.clock() - start_time
        if seconds <= 0:
            return
        rate = (step - start_step) / seconds
        total = trainer.max_steps / rate
        line = f"about {format_rate(rate)} steps/s: {trainer.max_steps} steps in about {format_duration(total)}"
        if self._first_step > 0:  # resumed: say what is left
            line += f", {format_duration(max(0, trainer.max_steps - step) / rate)} from now"
        self.echo(line)
        self._said = True


def format_rate(rate: float) -> str:
    """Steps per second with two significant digits below 10 (``0.27``, ``3.7``), whole above (``42``)."""
    return f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"


def format_duration(seconds: float) -> str:
    """``45 s``, ``31 min``, ``2 h 5 min``, ``21 days 10 h``: two units at most, rounded to the smaller."""
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(round(seconds / 3600), 24)
    return f"{days} days {hours} h" if hours else f"{days} days"


def _print(line: str) -> None:
    print(line, file=sys.stdout, flush=True)  # above Lightning's rich progress bar, which redirects stdout
