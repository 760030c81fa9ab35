"""Fine-tuning tasks and their labelled CSV files: read, validate, encode labels, split off a validation set.

Only the standard library is used (and :mod:`bionemo.esm2.data.readers` for the sequences), so the CLI checks
every input file before it imports torch.

A labelled CSV has a ``sequence`` column, optionally ``id``, and the label column(s). What a label looks like
depends on the :class:`Task`:

- ``regression``: one or more numeric columns (finite numbers).
- ``classification``: one column of class names (any non-empty text).
- ``multilabel``: several columns holding ``0`` or ``1``; the columns are the labels.
- ``token-classification``: one column with one label character per residue (FLIP's ``HEC`` strings).
- ``token-regression``: one column with one number per residue, space-separated.

A mask column (token tasks only) holds one ``0``/``1`` character per residue; ``0`` = not scored.
"""

import csv
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from bionemo.esm2.data.readers import CSV_SUFFIXES, FASTA_SUFFIXES, GZIP_SUFFIX, InputError, open_text, read_sequences

__all__ = [
    "LabelledData",
    "OptionError",
    "LabelVocabulary",
    "LabelledRecord",
    "Task",
    "check_label_options",
    "read_labelled_csv",
    "split",
]


class Task(StrEnum):
    """What is predicted: one value (or class) per sequence, or one per residue."""

    REGRESSION = "regression"
    CLASSIFICATION = "classification"
    MULTILABEL = "multilabel"
    TOKEN_CLASSIFICATION = "token-classification"
    TOKEN_REGRESSION = "token-regression"

    @property
    def per_residue(self) -> bool:
        """True for the token tasks (one label per residue), False for the sequence tasks."""
        return self in (Task.TOKEN_CLASSIFICATION, Task.TOKEN_REGRESSION)

    @property
    def categorical(self) -> bool:
        """True where labels are class names (classification, token-classification) encoded by a vocabulary."""
        return self in (Task.CLASSIFICATION, Task.TOKEN_CLASSIFICATION)


_SINGLE_COLUMN = (Task.CLASSIFICATION, Task.TOKEN_CLASSIFICATION, Task.TOKEN_REGRESSION)
_RESERVED = ("sequence", "id")


class OptionError(ValueError):
    """Fine-tuning options that do not fit together (task, label and mask columns, head); ``option`` names the flag.

    The CLI turns it into its usage error (exit code 2) for ``option``.
    """

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True, slots=True)
class LabelledRecord:
    """One sequence of a labelled CSV with its labels, parsed for its task.

    ``labels`` by task: regression and multilabel a tuple of floats, one per label column (multilabel: 0.0 or
    1.0); classification a 1-tuple holding the class name; token-classification the label string (one character
    per residue); token-regression a tuple of floats, one per residue.
    """

    id: str
    sequence: str
    labels: tuple[float, ...] | tuple[str] | str
    mask: tuple[bool, ...] | None = None
    """Per residue: True where the residue is scored (token tasks with a mask column), or None (all scored)."""

    def scored(self) -> Iterable[int]:
        """Indices of the residues the loss and metrics see (all of them without a mask)."""
        return range(len(self.sequence)) if self.mask is None else (i for i, m in enumerate(self.mask) if m)


def check_label_options(task: Task, label_columns: Sequence[str], mask_column: str | None = None) -> None:
    """Refuse label options that cannot fit ``task``, before any file is read.

    Raises:
        OptionError: No label column; several for a task that takes one (classification and the token
            tasks); a column given twice; ``sequence`` / ``id`` as a label or mask column; a mask column for a
            sequence task, or one that is also a label column.
    """
    task = Task(task)
    if not label_columns:
        raise OptionError(f"--task {task} needs a label column; give --label-column NAME", "--label-column")
    if task in _SINGLE_COLUMN and len(label_columns) > 1:
        raise OptionError(
            f"--task {task} takes one --label-column, got {len(label_columns)}: {list(label_columns)}",
            "--label-column",
        )
    keys = [_key(c) for c in label_columns]
    twice = sorted({c for c, k in zip(label_columns, keys, strict=True) if keys.count(k) > 1})
    if twice:
        raise OptionError(f"--label-column {twice} given more than once", "--label-column")
    for column in label_columns:
        if _key(column) in _RESERVED:
            raise OptionError(
                f"--label-column {column!r} is the {_key(column)!r} column, not a label", "--label-column"
            )
    if mask_column is None:
        return
    if not task.per_residue:
        raise OptionError(
            f"--mask-column applies to the per-residue tasks ({Task.TOKEN_CLASSIFICATION}, "
            f"{Task.TOKEN_REGRESSION}), not --task {task}",
            "--mask-column",
        )
    if _key(mask_column) in (*_RESERVED, *keys):
        raise OptionError(f"--mask-column {mask_column!r} is also the sequence, id or a label column", "--mask-column")


def read_labelled_csv(
    path: Path,
    task: Task,
    label_columns: Sequence[str],
    mask_column: str | None = None,
    max_length: int | None = None,
    truncate: bool = False,
) -> list[LabelledRecord]:
    """Read and validate every row of a labelled CSV (plain or gzipped ``.csv.gz``) for ``task``.

    The sequences are read and checked by :func:`bionemo.esm2.data.readers.read_sequences` (alphabet, gaps, duplicate
    ids, length); columns are matched ignoring case and surrounding spaces. With ``truncate``, per-residue labels
    and masks are cut with their sequence.

    Args:
        path: The CSV file.
        task: What the labels are (the module docstring says how each is written).
        label_columns: The label column names, as given on the command line.
        mask_column: A 0/1 string per residue (token tasks only), or None.
        max_length: Longest sequence (residues) allowed, or None.
        truncate: Cut longer sequences (and their per-residue labels) to ``max_length`` instead of refusing them.

    Raises:
        OptionError: The options do not fit the task (:func:`check_label_options`).
        InputError: A FASTA file (it cannot carry labels), an empty file, every error of ``read_sequences``, a
            missing label or mask column (the message lists the columns found), or a bad label: empty,
            non-numeric or not finite, multilabel not 0/1, a per-residue string whose length is not the
            sequence's, a mask not 0/1. Messages name the file, the line, the sequence id and the value.
    """
    task = Task(task)
    check_label_options(task, label_columns, mask_column)
    name = path.name.lower().removesuffix(GZIP_SUFFIX)
    if name.endswith(FASTA_SUFFIXES):
        raise InputError(
            f"data file {path} is FASTA, which cannot carry labels; give a CSV ({'/'.join(CSV_SUFFIXES)}, "
            f"optionally {GZIP_SUFFIX}) with a 'sequence' column, optionally 'id', and the label column(s) "
            f"{list(label_columns)}"
        )
    if path.is_file() and path.stat().st_size == 0:
        raise InputError(
            f"data file {path} is empty; give a CSV with a header (sequence, {', '.join(label_columns)}) "
            "and one row per sequence"
        )
    sequences = read_sequences(path, max_length, truncate)
    with open_text(path) as lines:
        reader = csv.DictReader(lines)
        header = [(c or "").strip() for c in (reader.fieldnames or [])]
        found = {_key(c) for c in header}
        for kind, wanted in (("label", label_columns), ("mask", [mask_column] if mask_column is not None else [])):
            missing = [c for c in wanted if _key(c) not in found]
            if missing:
                raise InputError(f"{path}: no {kind} column {missing} in the CSV header; the columns found: {header}")
        records = []
        rows = enumerate(reader, start=2)  # the line numbers read_sequences uses
        for (line, row), sequence in zip(rows, sequences, strict=True):
            cells = {_key(k or ""): (v or "").strip() for k, v in row.items()}
            where = f"{path}:{line}: sequence {sequence.id!r}"
            length = len(sequence.sequence)
            values = [cells[_key(c)] for c in label_columns]
            labels = _parse_labels(task, values, label_columns, where, length, sequence.truncated_from)
            mask = None
            if mask_column is not None:
                mask = _parse_mask(cells[_key(mask_column)], mask_column, where, length, sequence.truncated_from)
            records.append(LabelledRecord(sequence.id, sequence.sequence, labels, mask))
    return records


@dataclass(frozen=True, slots=True, kw_only=True)
class LabelVocabulary:
    """What the model's outputs mean: the label columns and, for categorical tasks, the class names.

    ``classes`` are sorted (Python's string order), as found in the training set: class ``i`` of the logits is
    ``classes[i]``. Stored in the fine-tuned model's metadata (:meth:`to_json`) so predictions decode to names.
    """

    task: Task
    """The task the vocabulary was built for."""
    columns: tuple[str, ...]
    """The label columns as given at fine-tuning (``predictions.csv`` names its columns so)."""
    classes: tuple[str, ...] = ()
    """Class names (classification) or label characters (token-classification); empty for the other tasks."""

    def __post_init__(self) -> None:
        if self.task.categorical and len(self.classes) < 2:
            raise ValueError(f"classes: a {self.task} vocabulary needs at least 2 classes, got {list(self.classes)}")
        if not self.task.categorical and self.classes:
            raise ValueError(f"classes: only categorical tasks have classes, not {self.task}")

    @classmethod
    def from_records(
        cls, task: Task, label_columns: Sequence[str], records: Sequence[LabelledRecord], path: Path | None = None
    ) -> "LabelVocabulary":
        """The vocabulary of a training set (``path`` names it in messages).

        Raises:
            InputError: A categorical task whose scored labels hold one class only, or a multilabel column that
                is the same (all 0 or all 1) in every row: there would be nothing to learn.
        """
        task = Task(task)
        where = f"{path}: " if path is not None else ""
        classes: tuple[str, ...] = ()
        if task.categorical:
            classes = tuple(sorted(_classes(task, records)))
            if len(classes) < 2:
                raise InputError(
                    f"{where}the training labels ({label_columns[0]!r}) hold one class only, {list(classes)}; "
                    "classification needs at least 2"
                )
        elif task is Task.MULTILABEL:
            for i, column in enumerate(label_columns):
                seen = {record.labels[i] for record in records}
                if len(seen) < 2:
                    raise InputError(
                        f"{where}multilabel column {column!r} is {int(seen.pop())} in every training row; "
                        "nothing to learn from it: drop it from --label-column"
                    )
        return cls(task=task, columns=tuple(label_columns), classes=classes)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Names of the model's output columns, in order: the classes, else the label columns."""
        return self.classes if self.task.categorical else self.columns

    @property
    def num_outputs(self) -> int:
        """The head's output size: classes, label columns (regression, multilabel) or 1 (token-regression)."""
        return len(self.outputs)

    def check_unseen(self, records: Iterable[LabelledRecord], path: Path | None = None) -> None:
        """Refuse validation labels the training set does not have (the model cannot predict them).

        Raises:
            InputError: Names the first sequence with an unseen class, the unseen classes and the known ones.
        """
        if not self.task.categorical:
            return
        known = set(self.classes)
        for record in records:
            unseen = sorted(_classes(self.task, [record]) - known)
            if unseen:
                where = f"{path}: " if path is not None else ""
                raise InputError(
                    f"{where}sequence {record.id!r} has label(s) {unseen} that the training data does not have "
                    f"(training classes: {list(self.classes)})"
                )

    def encode(self, record: LabelledRecord) -> tuple[int, ...] | tuple[float, ...]:
        """The record's targets as numbers.

        Classification: ``(class_index,)``; token-classification: one class index per residue (an unscored
        residue whose label is not a class: 0, never scored); the numeric tasks: their floats.

        Raises:
            KeyError: A class the vocabulary lacks (:meth:`check_unseen` refuses those with a message).
        """
        if self.task is Task.CLASSIFICATION:
            return (self.classes.index(record.labels[0]),)  # type: ignore[arg-type]
        if self.task is Task.TOKEN_CLASSIFICATION:
            index = {c: i for i, c in enumerate(self.classes)}
            scored = set(record.scored())
            return tuple(index[c] if i in scored else index.get(c, 0) for i, c in enumerate(str(record.labels)))
        return tuple(float(v) for v in record.labels)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form (for the model file's metadata); :meth:`from_json` reads it back."""
        return {"task": str(self.task), "columns": list(self.columns), "classes": list(self.classes)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LabelVocabulary":
        """The vocabulary :meth:`to_json` wrote."""
        return cls(task=Task(data["task"]), columns=tuple(data["columns"]), classes=tuple(data["classes"]))


def split(
    records: Sequence[LabelledRecord], val_fraction: float, seed: int, *, task: Task | None = None
) -> tuple[list[LabelledRecord], list[LabelledRecord]]:
    """A seeded split into (training, validation), each in input order, for when no ``--val-data`` is given.

    The validation set holds ``round(val_fraction * n)`` records (at least 1, at most ``n - 1``). For
    ``Task.CLASSIFICATION`` the split is stratified: each class gives ``round(val_fraction * n_class)`` records and
    keeps at least one for training, so validation never holds a class training lacks. The same records, fraction
    and seed always give the same split.

    Raises:
        ValueError: ``val_fraction`` outside (0, 1).
        InputError: Fewer than 2 records, or (stratified) no class with 2 records to share.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must lie strictly between 0 and 1, got {val_fraction}")
    n = len(records)
    if n < 2:
        raise InputError(f"{n} labelled sequence(s) cannot be split into training and validation; give at least 2")
    rng = random.Random(seed)
    if task is not Task.CLASSIFICATION:
        order = list(range(n))
        rng.shuffle(order)
        held = set(order[: min(n - 1, max(1, round(val_fraction * n)))])
    else:
        by_class: dict[str, list[int]] = {}
        for i, record in enumerate(records):
            by_class.setdefault(str(record.labels[0]), []).append(i)
        held = set()
        for name in sorted(by_class):
            members = by_class[name]
            rng.shuffle(members)
            held.update(members[: min(len(members) - 1, round(val_fraction * len(members)))])
        if not held:
            largest = max(sorted(by_class), key=lambda name: len(by_class[name]))
            if len(by_class[largest]) < 2:
                raise InputError(
                    "every class has one sequence only: a validation set would hold classes training lacks; "
                    "give --val-data"
                )
            held.add(by_class[largest][0])
    train = [r for i, r in enumerate(records) if i not in held]
    val = [r for i, r in enumerate(records) if i in held]
    return train, val


def _key(column: str) -> str:
    return column.strip().lower()


def _classes(task: Task, records: Iterable[LabelledRecord]) -> set[str]:
    """The class names of ``records``' scored labels."""
    if task is Task.CLASSIFICATION:
        return {str(record.labels[0]) for record in records}
    return {str(record.labels[i]) for record in records for i in record.scored()}


def _number(value: str, column: str, where: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise InputError(f"{where}: {column!r} holds {value!r}, not a finite number")
    return number


def _parse_labels(
    task: Task,
    values: list[str],
    columns: Sequence[str],
    where: str,
    length: int,
    truncated_from: int | None,
) -> tuple[float, ...] | tuple[str] | str:
    for value, column in zip(values, columns, strict=True):
        if not value:
            raise InputError(f"{where}: label column {column!r} is empty")
    if task is Task.REGRESSION:
        return tuple(_number(v, c, where) for v, c in zip(values, columns, strict=True))
    if task is Task.CLASSIFICATION:
        return (values[0],)
    if task is Task.MULTILABEL:
        for value, column in zip(values, columns, strict=True):
            if value not in ("0", "1"):
                raise InputError(f"{where}: multilabel column {column!r} holds {value!r}; give 0 or 1")
        return tuple(float(v) for v in values)
    column, value = columns[0], values[0]
    if task is Task.TOKEN_CLASSIFICATION:
        _check_length(len(value), column, "label characters", where, length, truncated_from)
        return value[:length]
    numbers = value.split()
    _check_length(len(numbers), column, "numbers", where, length, truncated_from)
    return tuple(_number(v, column, where) for v in numbers[:length])


def _parse_mask(value: str, column: str, where: str, length: int, truncated_from: int | None) -> tuple[bool, ...]:
    bad = sorted(set(value) - {"0", "1"})
    if bad:
        raise InputError(
            f"{where}: mask column {column!r} holds {bad}; give one 0 (not scored) or 1 (scored) per residue"
        )
    _check_length(len(value), column, "mask characters", where, length, truncated_from)
    return tuple(c == "1" for c in value[:length])


def _check_length(got: int, column: str, what: str, where: str, length: int, truncated_from: int | None) -> None:
    """Refuse per-residue labels that are not one per residue (of the sequence before ``--truncate`` cut it)."""
    residues = truncated_from if truncated_from is not None else length
    if got != residues:
        raise InputError(f"{where}: {column!r} has {got} {what} but the sequence has {residues} residues")


@dataclass(frozen=True, kw_only=True)
class LabelledData:
    """The training and validation records of a run and the labels they define."""

    train: list[LabelledRecord]
    val: list[LabelledRecord]
    vocabulary: LabelVocabulary
    split_from_train: bool
    """True when the validation records were split off ``--data`` (no ``--val-data``)."""
