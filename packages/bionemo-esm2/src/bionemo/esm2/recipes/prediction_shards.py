"""Resumable prediction shards: which inputs an interrupted ``run predict`` already wrote, and whether they still fit.

Prediction writes shards into ``OUTPUT_DIR/shards`` as it goes (each file appears complete or not at all). A
``run.json`` there holds a fingerprint of everything that decides the outputs: the checkpoint files, the input
sequences, the outputs asked for, their layers and types, and the precision. A rerun with the same fingerprint
predicts only the inputs no shard holds; any other run starts afresh. Batching and device counts are not part
of it: outputs do not depend on them.
"""

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PREDICTIONS", "check_previous_outputs", "finished_samples", "fingerprint", "remaining"]

STAMP = "run.json"
PREDICTIONS = "predictions.safetensors"
FINGERPRINT_KEY = "fingerprint"
"""The metadata key of ``predictions.safetensors`` holding the fingerprint of the run that wrote it."""


def fingerprint(checkpoint: Path, records: Iterable[Any], outputs: dict[str, Any]) -> str:
    """A hash of the checkpoint files (name, size, modification time), the records and ``outputs``."""
    digest = hashlib.sha256()
    files = sorted(p for p in checkpoint.rglob("*") if p.is_file()) if checkpoint.is_dir() else [checkpoint]
    for path in files:
        stat = path.stat()
        digest.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    for record in records:
        digest.update(f"{record.id}\0{record.sequence}\n".encode())
    digest.update(json.dumps(outputs, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def finished_samples(shards: Path, stamp: str, *, owner: bool) -> set[int]:
    """The input positions held by complete shards in ``shards`` written under the same fingerprint ``stamp``.

    With another fingerprint (or none) the shards cannot be reused: the ``owner`` (the rank that launched the
    run) removes them and records ``stamp``; every rank gets an empty set. Shards removed while being read
    count as absent, so ranks that look while the owner clears agree on the empty set.
    """
    from safetensors import SafetensorError, safe_open

    from bionemo.callbacks import prediction_files

    recorded = shards / STAMP
    if _recorded(recorded) != stamp:
        if owner:
            shutil.rmtree(shards, ignore_errors=True)
            shards.mkdir(parents=True)
            tmp = shards / f".{STAMP}.tmp"
            tmp.write_text(json.dumps({"fingerprint": stamp}))
            os.replace(tmp, recorded)
        return set()
    done: set[int] = set()
    for path in prediction_files(shards):
        try:
            with safe_open(str(path), framework="pt") as f:
                done.update(f.get_tensor("sample_index").tolist())
        except (OSError, SafetensorError):
            continue
    return done


def remaining(count: int, done: set[int]) -> Sequence[int]:
    """Input positions ``0..count-1`` not in ``done``, in order."""
    return [i for i in range(count) if i not in done]


def check_previous_outputs(out: Path, stamp: str, *, overwrite: bool) -> str | None:
    """Refuse to replace another run's predictions in ``out``; what ``--overwrite`` replaces, or None.

    A training run's folder is refused whatever ``overwrite`` says
    (:func:`bionemo.recipes.run_record.refuse_training_folder`): predictions would replace the run's ``summary.json``.

    ``out`` may hold this run's own outputs (the same fingerprint ``stamp``: an interrupted run's shards to
    resume, or a finished file that a rerun writes again, identically) or none. Anything else, a finished
    ``predictions.safetensors`` or an interrupted run's shards of other inputs, checkpoint or outputs, is
    refused unless ``overwrite``. Reads headers only (no torch), so it runs before anything heavy.

    Raises:
        SettingsError: ``out`` holds another run's predictions and ``overwrite`` is false, or is a training run's
            folder.
    """
    from bionemo.core.safetensors_header import SafetensorsHeaderError, read_safetensors_header
    from bionemo.recipes.run_record import refuse_training_folder
    from bionemo.recipes.settings import SettingsError

    refuse_training_folder(out)
    found = []
    shards = out / "shards"
    if any(shards.glob("predictions_rank*.safetensors")) and _recorded(shards / STAMP) != stamp:
        found.append(f"an interrupted prediction of other inputs or settings ({shards})")
    finished = out / PREDICTIONS
    if finished.is_file():
        try:
            metadata = read_safetensors_header(finished).metadata
        except (OSError, SafetensorsHeaderError):
            metadata = {}
        if metadata.get(FINGERPRINT_KEY) != stamp:
            count = len(json.loads(metadata.get("ids", "[]")))
            found.append(f"{count:,} predictions of other inputs or settings ({finished})")
    if not found:
        return None
    if not overwrite:
        raise SettingsError(
            f"--output-dir {out} already holds {' and '.join(found)}; give --overwrite to replace them, "
            "or another --output-dir (a rerun of the same command resumes or rewrites its own outputs)",
            "--output-dir",
        )
    return " and ".join(found)


def _recorded(stamp_file: Path) -> str | None:
    try:
        return json.loads(stamp_file.read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None
