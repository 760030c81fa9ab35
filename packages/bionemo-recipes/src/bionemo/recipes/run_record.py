"""Which run a training folder's checkpoints belong to, so that a rerun resumes its own run and nothing else.

A rerun of ``bionemo run train`` / ``run finetune`` into the same ``--output-dir`` continues from the newest whole
checkpoint in ``<output-dir>/checkpoints``. That is only right for the run that wrote it: another task, head, model,
data, seed or global batch would load weights of other shapes (a traceback from ``load_state_dict``) or, worse,
silently continue a run that trained on something else. So every run records what defines it, its *identity*, in
``checkpoints/run.json`` (:func:`start_run_record`), and before anything is written a rerun compares its own
(:func:`check_resumable`):

- the same identity: it resumes (what may change on a resume: the run length, validation interval, learning rate
  and schedule, precision, devices and parallel layout, micro-batch size, ``--verbose``);
- another identity, or checkpoints of the other strategy family (Lightning's ``last.ckpt`` for a run under NeMo's
  MegatronStrategy, or megatron's ``step<N>/`` for one under Lightning's strategies, which cannot read each other's
  files): refused with exit 2, naming the folder and what differs, before anything is written;
- ``--no-resume``: the folder's earlier checkpoints (of any run) are removed when the run starts
  (:func:`clear_checkpoints`), so that no later rerun resumes from them.

Checkpoints without ``run.json`` (written before it existed) are resumed as before. No torch or Lightning: the
check runs with the other input checks, before torch is imported.
"""

import hashlib
import json
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bionemo.core.atomic_files import replaced_atomically
from bionemo.recipes.resolved import SETTINGS_FILE
from bionemo.recipes.settings import RunSettings, SettingsError

__all__ = [
    "RUN_FILE",
    "check_resumable",
    "clear_checkpoints",
    "records_digest",
    "refuse_prediction_folder",
    "refuse_training_folder",
    "run_identity",
    "split_digests",
    "start_run_record",
    "whole_checkpoint",
]

RUN_FILE = "run.json"
"""The file in a run's checkpoint folder that holds the run's identity (:func:`run_identity`)."""

LIGHTNING_CHECKPOINT = "last.ckpt"

_VALUES = ("recipe", "seed", "truncate")


def run_identity(settings: RunSettings, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What defines a training run: a resume must not change it (JSON values).

    ``settings`` are the resolved settings (batch sizes decided); ``extra`` the recipe's resolved parts that
    ``settings`` leave implicit: the data the run trains and validates on (:func:`records_digest` of each part:
    the records, not the files' paths, so a moved file is the same run and an edited one is not), the model's
    hyper-parameters, a fine-tuning run's task, head, labels and encoder; JSON values. The starting checkpoint is
    its absolute path. The global batch is ``global_batch_tokens`` where batches are cut by tokens, else
    ``global_batch_size``: either is the same on every layout.
    """
    checkpoint = settings.checkpoint
    identity: dict[str, Any] = {"checkpoint": None if checkpoint is None else str(Path(checkpoint).resolve())}
    identity.update({name: getattr(settings, name) for name in _VALUES})
    if settings.global_batch_tokens is not None:
        identity["global_batch_tokens"] = settings.global_batch_tokens
    else:
        identity["global_batch_size"] = settings.global_batch_size
    identity.update(extra or {})
    return json.loads(json.dumps(identity, default=str))  # as the file will read back: tuples as lists


def records_digest(records: Iterable[Sequence[Any]]) -> dict[str, Any]:
    """``{"records": count, "sha256": first 16 hex digits}`` of ``records`` (each a row of fields, in order).

    Each field is hashed as its ``repr``, fields and rows delimited, so two lists of records digest alike exactly
    when they hold the same fields in the same order.
    """
    digest, count = hashlib.sha256(), 0
    for record in records:
        digest.update("\x1f".join(map(repr, record)).encode() + b"\x1e")
        count += 1
    return {"records": count, "sha256": digest.hexdigest()[:16]}


def split_digests(train: Iterable[Sequence[Any]], val: Iterable[Sequence[Any]]) -> dict[str, Any]:
    """``{"train": ..., "val": ...}``: :func:`records_digest` of a run's training and validation records."""
    return {"train": records_digest(train), "val": records_digest(val)}


def refuse_training_folder(out: Path) -> None:
    """Refuse ``run predict``'s ``--output-dir`` where a training run writes (its summary.json would go).

    A training run's folder holds ``settings.yaml`` (written when it starts) or ``checkpoints/``.

    Raises:
        SettingsError: ``out`` is such a folder.
    """
    if (out / SETTINGS_FILE).is_file() or (out / "checkpoints").is_dir():
        raise SettingsError(
            f"--output-dir {out} is a training run's folder (its settings.yaml, checkpoints and summary.json); "
            f"predictions there would replace the run's summary.json: give another --output-dir, e.g. "
            f"{out / 'predictions'}",
            "--output-dir",
        )


def refuse_prediction_folder(out: Path) -> None:
    """Refuse a training run's ``--output-dir`` that holds ``run predict``'s outputs (its summary.json would go).

    Raises:
        SettingsError: ``out`` holds ``predictions.safetensors`` or an interrupted prediction's ``shards/``.
    """
    if (out / "predictions.safetensors").is_file() or (out / "shards").is_dir():
        raise SettingsError(
            f"--output-dir {out} holds `run predict`'s outputs (predictions.safetensors, summary.json); a training "
            f"run there would replace its summary.json: give another --output-dir, e.g. {out / 'run'}",
            "--output-dir",
        )


def whole_checkpoint(checkpoints: Path, *, megatron: bool) -> Path | None:
    """The newest whole checkpoint in ``checkpoints`` of the strategy family (``megatron`` or Lightning's), or None.

    Lightning's strategies write ``last.ckpt`` atomically (a temporary file, then a rename). A megatron distributed
    checkpoint ``step<N>/`` is whole once ``weights/metadata.json`` exists: megatron-core writes it after every
    rank's shards.
    """
    if not megatron:
        last = checkpoints / LIGHTNING_CHECKPOINT
        return last if last.is_file() else None
    whole = {
        int(path.name.removeprefix("step")): path
        for path in checkpoints.glob("step*")
        if path.name.removeprefix("step").isdigit() and (path / "weights" / "metadata.json").is_file()
    }
    return whole[max(whole)] if whole else None


def check_resumable(
    settings: RunSettings, checkpoints: Path, identity: Mapping[str, Any], *, megatron: bool
) -> str | None:
    """The checkpoint this run resumes from (None: it starts afresh); refuses another run's checkpoints.

    Args:
        settings: The run's resolved settings (``resume``: false for ``--no-resume``).
        checkpoints: The run's checkpoint folder (``<output-dir>/checkpoints``).
        identity: This run's :func:`run_identity`.
        megatron: Whether the run trains under NeMo's MegatronStrategy (else Lightning's strategies).

    Raises:
        SettingsError: ``checkpoints`` holds a whole checkpoint of a run with another identity, or only
            checkpoints of the other strategy family, and ``settings.resume`` is true.
    """
    if not settings.resume:
        return None
    found = whole_checkpoint(checkpoints, megatron=megatron)
    if found is None:
        other = whole_checkpoint(checkpoints, megatron=not megatron)
        if other is not None:
            raise SettingsError(_other_family(checkpoints, other, megatron=megatron), "--output-dir")
        return None
    recorded = _recorded(checkpoints / RUN_FILE)
    if recorded is None or recorded == dict(identity):
        return str(found)
    before, now = _leaves(recorded), _leaves(identity)
    changes = "; ".join(
        f"{name} {_shown(before.get(name))} -> {_shown(now.get(name))}"
        for name in sorted({*before, *now})
        if before.get(name) != now.get(name)
    )
    out = checkpoints.parent
    raise SettingsError(
        f"--output-dir {out} holds the checkpoints of another run ({found.name}), which this run cannot resume: "
        f"{changes}. Rerun with that run's settings to continue it (--config {out / 'settings.yaml'}), give another "
        "--output-dir, or give --no-resume to start afresh there (its checkpoints are removed)",
        "--output-dir",
    )


def start_run_record(settings: RunSettings, checkpoints: Path, identity: Mapping[str, Any]) -> None:
    """Record this run in ``checkpoints`` (the launching process, once the run's checks have passed).

    With ``--no-resume`` the folder's earlier checkpoints go first (:func:`clear_checkpoints`, one line on
    stderr naming them). Then ``identity`` goes to ``checkpoints/run.json``, written atomically.
    """
    if not settings.resume and (removed := [p for p in clear_checkpoints(checkpoints) if p.name != RUN_FILE]):
        names = ", ".join(path.name for path in removed)
        print(f"--no-resume: removed the earlier checkpoints in {checkpoints} ({names})", file=sys.stderr, flush=True)
    with replaced_atomically(checkpoints / RUN_FILE) as temporary:
        temporary.write_text(json.dumps(dict(identity), indent=1, sort_keys=True) + "\n", encoding="utf-8")


def clear_checkpoints(checkpoints: Path) -> list[Path]:
    """Remove every resumable checkpoint (either family) and the run record from ``checkpoints``; what went.

    For ``--no-resume``: the run starts afresh, and a later rerun must not find an earlier run's checkpoints (a
    megatron ``step<N>/`` of a higher step would outrank the new run's own).
    """
    removed = []
    for path in sorted(checkpoints.glob("*")):
        step = path.name.removeprefix("step").removesuffix(".ckpt")
        if path.name in (LIGHTNING_CHECKPOINT, RUN_FILE) or (path.name.startswith("step") and step.isdigit()):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            removed.append(path)
    return removed


def _recorded(path: Path) -> dict[str, Any] | None:
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) else None


def _other_family(checkpoints: Path, other: Path, *, megatron: bool) -> str:
    if megatron:
        written, reader = "Lightning's strategies (CPUs, or --strategy ddp)", "NeMo's MegatronStrategy (GPUs)"
    else:
        written, reader = "NeMo's MegatronStrategy (GPUs)", "Lightning's strategies (CPUs, or --strategy ddp)"
    return (
        f"--output-dir {checkpoints.parent} holds a checkpoint written under {written} ({other}), which this run, "
        f"under {reader}, cannot resume from: continue it with the accelerator and strategy that wrote it, give "
        "another --output-dir, or give --no-resume to start afresh there (its checkpoints are removed)"
    )


def _leaves(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``values`` with nested mappings flattened to dotted names (``finetune.head.kind``)."""
    flat: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, Mapping) and value:
            flat.update(_leaves(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def _shown(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
