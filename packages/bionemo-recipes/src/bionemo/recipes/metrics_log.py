"""``metrics.csv`` that survives a resume: the earlier run's rows stay, the resumed run's rows follow.

Lightning's CSVLogger deletes ``metrics.csv`` whenever a run opens its log directory again, so a resumed run
loses every step before the resume and rerunning a finished run empties the log. :class:`ResumableCSVLogger`
keeps the file when it continues a run and appends to it.

A resumed run logs again what the earlier run logged after the checkpoint (the validation that followed it,
the steps a killed run took after it). Like TensorBoard's ``purge_step``, but per metric: the first step at
which the resumed run logs a metric replaces the earlier run's values of that metric from that step on.
:class:`CSVLogPosition` stores in each checkpoint how many rows the file held, and those rows are never
replaced (the untrained model's validation at step 0, say, when validation runs after every step).

Imports Lightning: import this module inside commands, not at ``bionemo --help`` time.
"""

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override

__all__ = ["CSVLogPosition", "ResumableCSVLogger"]

_NOT_METRICS = frozenset({"step", "epoch"})


class ResumableCSVLogger(CSVLogger):
    """A CSVLogger that, with ``resume=True``, continues the ``metrics.csv`` already in its log directory.

    Without ``resume`` it is Lightning's CSVLogger: a run from scratch starts a fresh file.
    """

    def __init__(self, save_dir: str | Path, *, name: str, version: str, resume: bool) -> None:
        """Log to ``save_dir/name/version/metrics.csv``, continuing the file there when ``resume``."""
        super().__init__(save_dir, name=name, version=version)
        self.resume = resume
        self.rows_at_checkpoint = 0
        """Rows the file held when the checkpoint this run resumes was saved (set by :class:`CSVLogPosition`)."""
        self._logged: set[str] = set()
        self._last_row: tuple[int | None, list[tuple[str, str]]] | None = None

    @override
    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Lightning's ``log_metrics``, except that a row equal to the one just logged at the same step is dropped.

        :class:`CSVLogPosition` writes a step's training row here before Lightning does; Lightning's own call, to
        every logger, repeats it.
        """
        row = (step, sorted((key, repr(value)) for key, value in metrics.items()))
        if row == self._last_row:
            return
        self._last_row = row
        super().log_metrics(metrics, step)

    @property
    @override
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if not isinstance(self._experiment, ExperimentWriter):
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(self.log_dir) if self.resume else ExperimentWriter(self.log_dir)
        return self._experiment

    @override
    @rank_zero_only
    def save(self) -> None:
        writer = self.experiment
        first: dict[str, int] = {}  # metric -> the first step this run logs it at
        for row in writer.metrics:
            step = int(row["step"])
            for key in row.keys() - _NOT_METRICS - self._logged:
                first[key] = min(first.get(key, step), step)
        self._logged |= first.keys()
        if first and isinstance(writer, _AppendingWriter):
            writer.drop_earlier(
                lambda row: any(row.get(key) and int(float(row["step"])) >= step for key, step in first.items()),
                keep=self.rows_at_checkpoint,
            )
        super().save()


class CSVLogPosition(pl.Callback):
    """Saves how many rows ``logger``'s ``metrics.csv`` holds with every checkpoint; hands it back on resume.

    It also writes each step's training row before that step's checkpoint exists. Lightning logs a step's metrics
    only after every ``on_train_batch_end`` hook, and checkpoints are saved in that hook, so a run killed between
    the two would lose the row for good: its resume starts after that step.
    """

    def __init__(self, logger: ResumableCSVLogger) -> None:
        """Track ``logger``'s file."""
        self.csv_logger = logger

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Lightning runs checkpoint callbacks after the others: this comes before any checkpoint of the step.
        # Only this CSV logger gets the early row; Lightning's own call next logs to every logger once.
        loggers = trainer.loggers
        trainer.loggers = [self.csv_logger]
        try:
            trainer._logger_connector.update_train_step_metrics()  # what Lightning calls next; it logs and saves
        finally:
            trainer.loggers = loggers

    @override
    def state_dict(self) -> dict[str, Any]:
        self.csv_logger.save()  # what was logged before the checkpoint is on disk before it is counted
        return {"rows": _rows(Path(self.csv_logger.log_dir) / ExperimentWriter.NAME_METRICS_FILE)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.csv_logger.rows_at_checkpoint = int(state_dict["rows"])


class _AppendingWriter(ExperimentWriter):
    """Lightning's writer, minus deleting ``metrics.csv``: it appends under the file's header."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        self.earlier_rows = 0
        """Rows of earlier runs still in the file, before the ones this run appends."""
        path = Path(self.metrics_file_path)
        if path.is_file():
            with path.open(newline="") as file:
                self.metrics_keys = next(csv.reader(file), [])
            self.earlier_rows = _rows(path)

    @override
    def _check_log_dir_exists(self) -> None:
        """Keep what is there: this run continues it."""

    def drop_earlier(self, replaced: Callable[[dict[str, str]], bool], keep: int) -> None:
        """Remove the earlier runs' rows past the first ``keep`` for which ``replaced(row)`` is true."""
        path = Path(self.metrics_file_path)
        if self.earlier_rows <= keep or not path.is_file():
            return
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            fields, rows = list(reader.fieldnames or []), list(reader)
        earlier, later = rows[keep : self.earlier_rows], rows[self.earlier_rows :]
        kept = [row for row in earlier if not replaced(row)]
        if len(kept) == len(earlier):
            return
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=fields)
            writer.writeheader()
            writer.writerows([*rows[:keep], *kept, *later])
        self.earlier_rows = keep + len(kept)


def _rows(metrics_csv: Path) -> int:
    """Data rows in ``metrics_csv`` (0 without one)."""
    if not metrics_csv.is_file():
        return 0
    with metrics_csv.open(newline="") as file:
        return max(0, sum(1 for _ in csv.reader(file)) - 1)
