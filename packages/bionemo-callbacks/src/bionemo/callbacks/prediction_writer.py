"""Write predictions per rank as safetensors files, and merge them back into input order."""

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks.prediction_writer import WriteInterval
from safetensors.torch import load_file
from typing_extensions import override

from bionemo.collate import DEFAULT_BATCH_DIMS, batch_collator
from bionemo.core.safetensors_io import save_safetensors_atomically
from bionemo.losses import ParallelGroups

__all__ = ["DEFAULT_INDEX_KEY", "PredictionWriter", "merge_predictions", "prediction_files"]

DEFAULT_INDEX_KEY = "sample_index"
"""Key of the ``[b]`` integer tensor holding each sample's position in the input."""

_FILE_RE = re.compile(r"^predictions_rank(\d+)(?:_batch(\d+)|_sample(\d+))?\.safetensors$")


def prediction_files(output_dir: str | os.PathLike[str], rank: int | None = None) -> list[Path]:
    """The complete prediction files in ``output_dir`` (of one global ``rank``, or of all), sorted by name."""
    found = []
    for path in sorted(Path(output_dir).glob("predictions_rank*.safetensors")):
        match = _FILE_RE.match(path.name)
        if match and (rank is None or int(match.group(1)) == rank):
            found.append(path)
    return found


class PredictionWriter(pl.Callback):
    """Write ``trainer.predict`` outputs to ``output_dir`` as safetensors files, one set per rank.

    Each prediction must be a flat dict of tensors holding ``index_key``: the ``[b]`` input positions of its
    samples (``BionemoLightningModule`` copies it from the batch). Only ranks that hold the full output
    write: the last pipeline stage at tensor- and context-parallel rank 0, so each data-parallel replica
    writes once. Files appear atomically (written to a temporary name, then renamed) and load without
    pickle. :func:`merge_predictions` joins them back into input order.

    Files: ``predictions_rank{R}_batch{B}.safetensors`` per batch (``write_interval="batch"``) or
    ``predictions_rank{R}.safetensors`` per epoch (``"epoch"``, the outputs of the epoch collated on CPU).
    With ``keep_existing`` files are named ``predictions_rank{R}_sample{S}.safetensors`` after the first sample
    position ``S`` they hold instead, so a rerun over the samples no file holds yet adds files and replaces none.

    Args:
        output_dir: Directory to write into; created if missing.
        write_interval: ``"batch"`` or ``"epoch"``.
        index_key: Key of the sample positions in each prediction.
        overwrite: Remove every earlier prediction file in ``output_dir`` (of any rank) instead of refusing to start.
        groups: Process groups that decide whether this rank writes; ``None`` reads megatron's current ones.
        keep_existing: Keep earlier prediction files (resuming an interrupted prediction) instead of refusing
            to start; files are named after their first sample.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike[str],
        write_interval: WriteInterval | str = WriteInterval.EPOCH,
        index_key: str = DEFAULT_INDEX_KEY,
        overwrite: bool = False,
        groups: ParallelGroups | None = None,
        keep_existing: bool = False,
    ) -> None:
        super().__init__()
        if overwrite and keep_existing:
            raise ValueError("overwrite=True removes earlier files and keep_existing=True keeps them; choose one")
        valid = (WriteInterval.BATCH.value, WriteInterval.EPOCH.value)
        if str(getattr(write_interval, "value", write_interval)) not in valid:
            raise ValueError(f"write_interval={write_interval!r} is not valid; use one of {list(valid)}")
        self.output_dir = Path(output_dir)
        self.interval = WriteInterval(getattr(write_interval, "value", write_interval))
        self.index_key = index_key
        self.overwrite = overwrite
        self.keep_existing = keep_existing
        self._groups = groups
        self._pending: list[dict[str, torch.Tensor]] = []
        self._in_flight: tuple[dict[str, torch.Tensor], Any, int, str] | None = None

    @property
    def groups(self) -> ParallelGroups:
        """The process groups that decide whether this rank writes."""
        return ParallelGroups.current() if self._groups is None else self._groups

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Check (and with ``overwrite`` clear) ``output_dir`` on every rank, then wait for all ranks.

        No rank writes before every rank has looked at the folder: the barrier (``trainer.strategy.barrier``)
        comes after this rank's listing and removals and before any rank's first file, so a slow rank never
        takes a fast rank's new file of this run for an earlier prediction (refusing to start, or, with
        ``overwrite``, removing it). With a shared folder every rank sees the same earlier files and decides
        alike.

        Raises:
            PermissionError: ``output_dir`` is not writable.
            FileExistsError: ``output_dir`` holds earlier prediction files and neither ``overwrite`` nor
                ``keep_existing`` is set (raised after the barrier).
        """
        self._pending = []
        self._in_flight = None
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(self.output_dir, os.W_OK):
            raise PermissionError(f"Prediction output directory {self.output_dir} is not writable")
        existing = [] if self.keep_existing else prediction_files(self.output_dir)
        if self.overwrite:
            # every earlier shard goes, whichever rank wrote it: a run on fewer ranks must not merge stale rows.
            # Global rank 0 removes them all, each rank its own (node-local directories).
            own = existing if trainer.global_rank == 0 else prediction_files(self.output_dir, trainer.global_rank)
            for path in own:
                path.unlink(missing_ok=True)
        trainer.strategy.barrier("prediction_writer_start")
        if existing and not self.overwrite:
            raise FileExistsError(
                f"{self.output_dir} already holds predictions ({existing[0].name}, ...); choose another directory "
                "or pass overwrite=True"
            )

    @override
    def on_predict_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if outputs is None or not self.groups.holds_full_output():
            return
        prediction, copied = self._to_host(outputs)
        self._finish_previous()
        self._in_flight = (prediction, copied, trainer.global_rank, f"_batch{batch_idx}")

    def _finish_previous(self) -> None:
        """Write (or keep for the epoch's file) the previous batch, once its copy to the host is complete.

        Batch N's device-to-host copy runs while the host queues batch N+1: the loop never waits for the device
        at a batch's end (a blocking copy did, for every batch).
        """
        if self._in_flight is None:
            return
        prediction, copied, rank, suffix = self._in_flight
        self._in_flight = None
        if copied is not None:
            copied.synchronize()
        if self.interval == WriteInterval.BATCH:
            self._write(prediction, self._name(rank, suffix, prediction))
        else:
            self._pending.append(prediction)

    @override
    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish_previous()
        if self.interval == WriteInterval.EPOCH and self._pending:
            collated = batch_collator(self._pending)
            self._write(collated, self._name(trainer.global_rank, "", collated))
        self._pending = []

    def _name(self, rank: int, suffix: str, prediction: Mapping[str, torch.Tensor]) -> str:
        if self.keep_existing:
            suffix = f"_sample{int(prediction[self.index_key].min())}"
        return f"predictions_rank{rank}{suffix}.safetensors"

    def _checked(self, outputs: Any) -> dict[str, torch.Tensor]:
        if not isinstance(outputs, Mapping) or not all(
            isinstance(v, torch.Tensor) or v is None for v in outputs.values()
        ):
            raise TypeError(
                "PredictionWriter writes flat dicts of tensors; got "
                f"{type(outputs).__name__}" + (f" with keys {sorted(outputs)}" if isinstance(outputs, Mapping) else "")
            )
        if self.index_key not in outputs or outputs[self.index_key] is None:
            raise KeyError(
                f"Prediction has no {self.index_key!r} (sample positions needed to restore input order); "
                f"keys are {sorted(outputs)}. Put the index in the batch under {self.index_key!r}."
            )
        return {k: v for k, v in outputs.items() if v is not None}

    def _to_host(self, outputs: Any) -> tuple[dict[str, torch.Tensor], Any]:
        """``outputs`` on the host, and the CUDA event that marks their copy complete (None: nothing to wait for).

        CUDA tensors are copied without blocking, into page-locked memory; the event is recorded after the copies.
        """
        checked = self._checked(outputs)
        on_host = {k: v.detach().to("cpu", non_blocking=True) for k, v in checked.items()}
        if not any(v.is_cuda for v in checked.values()):
            return on_host, None
        event = torch.cuda.Event()
        event.record()
        return on_host, event

    def _write(self, prediction: Mapping[str, torch.Tensor], name: str) -> None:
        save_safetensors_atomically(prediction, self.output_dir / name, {"index_key": self.index_key})


def merge_predictions(
    output_dir: str | os.PathLike[str],
    index_key: str = DEFAULT_INDEX_KEY,
    batch_dim_key_defaults: Mapping[str, int] | None = None,
) -> dict[str, torch.Tensor]:
    """Load every rank's prediction files from ``output_dir`` and return one batch in input order.

    Samples are sorted by ``index_key``; a sample predicted twice (distributed samplers repeat samples to
    even out shards) is kept once. Ragged sequence lengths are right-padded as in :func:`batch_collator`.

    Args:
        output_dir: Directory a :class:`PredictionWriter` wrote into.
        index_key: Key of the sample positions.
        batch_dim_key_defaults: Batch dimension per key (``None``: ``token_logits`` is ``[s, b, v]``).

    Raises:
        FileNotFoundError: No prediction file in ``output_dir``.
    """
    files = prediction_files(output_dir)
    if not files:
        raise FileNotFoundError(f"No predictions_rank*.safetensors files in {output_dir}")
    batch_dims = dict(DEFAULT_BATCH_DIMS) if batch_dim_key_defaults is None else dict(batch_dim_key_defaults)
    merged = batch_collator([load_file(path) for path in files], batch_dim_key_defaults=batch_dims)
    if index_key not in merged:
        raise KeyError(f"Prediction files in {output_dir} have no {index_key!r}; keys are {sorted(merged)}")
    index = merged[index_key].long().flatten()
    order = torch.argsort(index, stable=True)
    sorted_index = index[order]
    keep = torch.ones_like(sorted_index, dtype=torch.bool)
    keep[1:] = sorted_index[1:] != sorted_index[:-1]
    order = order[keep]
    return {key: value.index_select(batch_dims.get(key, 0), order) for key, value in merged.items()}
