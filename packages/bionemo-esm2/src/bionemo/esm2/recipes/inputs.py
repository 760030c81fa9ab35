"""What ``train``, ``predict`` and ``finetune`` read: the bundled demo files, the ``--checkpoint``, the data module.

The checkpoint's problems (:class:`~bionemo.esm2.hf.layout.CheckpointError`) become ``--checkpoint`` settings
errors here, at the recipes' edge (exit code 2 in the CLI).
"""

import functools
from importlib.resources import files
from pathlib import Path
from typing import Any

from bionemo.recipes.registry import RecipeDefaults
from bionemo.recipes.settings import RunSettings, SettingsError

__all__ = ["BUNDLED_CHECKPOINT", "BUNDLED_SEQUENCES", "checked_checkpoint", "checked_checkpoint_header", "datamodule"]

_RESOURCES = files("bionemo.esm2") / "resources"
BUNDLED_CHECKPOINT = Path(str(_RESOURCES / "esm2_demo.safetensors"))
"""Weights trained by the documented ``bionemo run train`` command (see resources/README)."""
BUNDLED_SEQUENCES = Path(str(_RESOURCES / "demo_sequences.fasta"))
"""Held-out members of the synthetic demo families, predicted by ``bionemo run predict`` by default."""


def datamodule(
    settings: RunSettings,
    defaults: RecipeDefaults,
    predicting: bool = False,
    *,
    loader: dict[str, Any] | None = None,
    **datasets: Any,
):
    """The recipe's MegatronDataModule; ``loader`` passes DataLoader options (``num_workers``, ``pin_memory``)."""
    from bionemo.esm2.data.mlm import collate_proteins
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning import MegatronDataModule

    micro = defaults.value(settings, "micro_batch_size")
    global_batch = settings.global_batch_size or (
        micro * settings.data_parallel_size()
        if predicting
        else max(defaults.global_batch_size, micro * settings.data_parallel_size())
    )
    return MegatronDataModule(
        micro_batch_size=micro,
        global_batch_size=global_batch,
        seq_length=defaults.model["seq_length"],
        collate_fn=functools.partial(collate_proteins, pad_id=ProteinTokenizer().pad_id),
        **(loader or {}),
        **datasets,
    )


def checked_checkpoint_header(path: Path):
    """:func:`bionemo.esm2.checkpoints.header.read_checkpoint_header` (no torch) with ``--checkpoint`` errors."""
    from bionemo.esm2.checkpoints.header import read_checkpoint_header
    from bionemo.esm2.hf.layout import CheckpointError

    try:
        return read_checkpoint_header(path)
    except CheckpointError as error:
        raise SettingsError(str(error), "--checkpoint") from None


def checked_checkpoint(path: Path):
    """:func:`bionemo.esm2.checkpoints.load.load_checkpoint` with its errors as ``--checkpoint`` settings errors."""
    from bionemo.esm2.checkpoints.load import load_checkpoint
    from bionemo.esm2.hf.layout import CheckpointError

    try:
        return load_checkpoint(path)
    except CheckpointError as error:
        raise SettingsError(str(error), "--checkpoint") from None
