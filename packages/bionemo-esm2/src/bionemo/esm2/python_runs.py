"""What the Python APIs share: sequences given as Python values run through ``bionemo run``'s own code.

:func:`bionemo.esm2.api.predict`, :func:`bionemo.esm2.finetune.api.finetune` and
:meth:`~bionemo.esm2.finetune.api.FinetunedModel.predict` write the sequences as the CLI's CSV into a temporary
folder, resolve the CLI's settings from their keywords, run the command's function in this process with the
libraries' chatter hidden (:func:`bionemo.core.library_chatter.libraries_quieted`), and name the argument
(``sequences[3]``) instead of the temporary file in the CLI's errors.

Importing this module imports no torch.
"""

import csv
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bionemo.core.library_chatter import libraries_quieted
from bionemo.recipes.settings import RunSettings, SettingsError

__all__ = [
    "RECIPE",
    "SequenceInput",
    "named_inputs",
    "predicted",
    "prediction_options",
    "quiet_imports",
    "run_settings",
    "sequence_pairs",
    "write_rows",
]

SequenceInput = str | tuple[str, str]
"""A protein sequence, or an ``(id, sequence)`` pair."""

RECIPE = "esm2-demo"
"""The CLI's default recipe: the runs take the model from the checkpoint and the rest from the recipe's defaults."""


@contextmanager
def quiet_imports(verbose: bool) -> Iterator[None]:
    """Import the libraries as ``bionemo run`` does: their import-time warnings hidden unless ``verbose``.

    First what ``bionemo run`` does before importing megatron-core (which fails on machines with nvcc and no GPU).
    """
    from bionemo.core.megatron_env import prepare_megatron_import

    with libraries_quieted(verbose):
        prepare_megatron_import()
        yield


def run_settings(options: dict[str, Any]) -> RunSettings:
    """:class:`RunSettings` from the CLI options' values (``None``: the default), checked as the CLI checks them."""
    return RunSettings.resolve(None, {key: value for key, value in options.items() if value is not None})


def prediction_options(
    checkpoint: Path,
    *,
    truncate: bool,
    micro_batch_size: int | None,
    tokens_per_batch: int | None,
    accelerator: Any,
    devices: int,
    precision: Any,
) -> dict[str, Any]:
    """The options every Python ``predict`` shares, by setting name (``None``: the CLI's default)."""
    return {
        "checkpoint": Path(checkpoint),
        "truncate": truncate,
        "micro_batch_size": micro_batch_size,
        "tokens_per_batch": tokens_per_batch,
        "accelerator": str(accelerator),
        "devices": devices,
        "precision": None if precision is None else str(precision),
    }


def sequence_pairs(sequences: Sequence[SequenceInput], name: str) -> list[tuple[str, str]]:
    """``(id, sequence)`` per item; ``""`` as the id where none was given (read as ``row<n>``, as the CLI does).

    Raises:
        TypeError: ``sequences`` is one string, or holds something other than strings and pairs of strings.
        ValueError: ``sequences`` is empty.
    """
    if isinstance(sequences, str | bytes):
        raise TypeError(f"{name}: give a list of sequences, not one {type(sequences).__name__}")
    pairs = []
    for i, item in enumerate(sequences):
        if isinstance(item, str):
            pairs.append(("", item))
        elif isinstance(item, tuple | list) and len(item) == 2 and all(isinstance(part, str) for part in item):
            pairs.append((item[0], item[1]))
        else:
            raise TypeError(f"{name}[{i}] is {item!r}; give a sequence (str) or an (id, sequence) pair of str")
    if not pairs:
        raise ValueError(f"{name} is empty; give at least one sequence")
    return pairs


def write_rows(path: Path, header: list[str], rows: Sequence[Sequence[str]]) -> Path:
    """A CSV file of ``header`` and ``rows`` (UTF-8)."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@contextmanager
def named_inputs(names: dict[Path, str]) -> Iterator[None]:
    """Re-raise errors naming a temporary input file with the argument's name instead (``sequences[3]``).

    The reader names rows ``path:line`` where ``line`` 2 is the first data row: item 0 of the argument.
    """
    from bionemo.esm2.data.readers import InputError

    try:
        yield
    except (SettingsError, InputError) as error:
        message = str(error)
        for path, name in names.items():
            where = re.escape(str(path))
            message = re.sub(where + r":(\d+)", lambda m, name=name: f"{name}[{int(m.group(1)) - 2}]", message)
            message = re.sub(rf"(data file )?{where}", name, message)
        if message == str(error):
            raise
        if isinstance(error, SettingsError):
            raise SettingsError(message, error.option) from None
        raise InputError(message) from None


@contextmanager
def predicted(sequences: Sequence[SequenceInput], options: dict[str, Any], *, verbose: bool) -> Iterator[Path]:
    """Run ``bionemo run predict`` of ``sequences`` in this process; yield its output folder, deleted afterwards.

    ``options``: the CLI's options by setting name (``checkpoint``, ``include``, ...; None: the default).

    Raises:
        SettingsError: What ``bionemo run predict`` refuses (messages name ``sequences[i]``).
        TypeError: ``sequences`` is a string or holds something other than strings and pairs.
    """
    pairs = sequence_pairs(sequences, "sequences")
    with quiet_imports(verbose):
        from bionemo.esm2.recipes import demo
        from bionemo.esm2.recipes.predict import predict

    with tempfile.TemporaryDirectory(prefix="bionemo_predict_") as folder:
        root = Path(folder)
        data = write_rows(root / "sequences.csv", ["id", "sequence"], pairs)
        out = root / "predictions"
        settings = run_settings({**options, "data": data, "output_dir": out})
        with named_inputs({data: "sequences"}), libraries_quieted(verbose):
            predict(settings, defaults=demo().defaults, recipe=RECIPE)
        yield out
