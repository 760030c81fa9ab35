"""Model checkpoints a user passes with ``--checkpoint``: a Hugging Face ESM-2 folder or a bionemo safetensors file.

Everything is read and checked here, on the host, before any process group starts: unreadable files, missing
tensors, shapes that disagree with the config and NaN/Inf values each raise a :class:`CheckpointError` that
names the file and the tensor.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bionemo.esm2.hf import CheckpointError, check_bionemo_tensors, is_hf_folder, load_hf_checkpoint
from bionemo.esm2.weights import read_metadata, read_weights

__all__ = ["CheckpointError", "LoadedCheckpoint", "check_tensors", "load_checkpoint"]

ESM_DEFAULTS = {
    "seq_length": 1026,
    "layernorm_epsilon": 1e-5,
    "token_dropout": True,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "vocab_size": 33,
}
"""``ESM2Config``'s defaults for the settings a Hugging Face config also holds (older bionemo files omit them)."""


@dataclass(frozen=True, kw_only=True)
class LoadedCheckpoint:
    """Whole model tensors (vocabulary unpadded), the model settings and what was noted while reading."""

    path: Path
    """The file or folder given."""
    tensors: dict[str, torch.Tensor]
    """bionemo tensor names (see ``bionemo.esm2.hf.bionemo_shapes``), float32 or as stored, on CPU."""
    model: dict[str, Any]
    """``ESM2Config`` settings: shape, ``seq_length``, ``token_dropout``, layer-norm epsilon, dropout."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The bionemo file's metadata (recipe, training steps, validation perplexity); empty for Hugging Face."""
    notes: list[str] = field(default_factory=list)
    """One-line notes, e.g. Hugging Face tensors that are not model weights here (contact head)."""
    source: str = "bionemo"
    """``"bionemo"`` or ``"huggingface"``."""


def check_tensors(tensors: dict[str, torch.Tensor], model: dict[str, Any], where: str) -> None:
    """Every tensor the model needs is there, with exactly the shape ``model`` implies, and finite.

    Raises:
        CheckpointError: ``where``, then the missing tensors, or the tensor with its shape and the expected one,
            or the tensor holding NaN/Inf (``bionemo.esm2.hf.check_bionemo_tensors``).
    """
    try:
        check_bionemo_tensors(tensors, model, padded_vocab=False)
    except CheckpointError as error:
        raise CheckpointError(f"{where}: {error}") from None


def load_checkpoint(path: Path) -> LoadedCheckpoint:
    """Read and check ``path``: a Hugging Face ESM-2 folder or a bionemo ``.safetensors`` file.

    Raises:
        CheckpointError: A missing path, an unusable folder or file (see :func:`check_tensors` and
            ``bionemo.esm2.hf``), or a bionemo file without its model config.
    """
    if not path.exists():
        raise CheckpointError(
            f"checkpoint {path} does not exist; give a Hugging Face ESM-2 folder (config.json + model.safetensors "
            "or pytorch_model.bin) or a bionemo model.safetensors"
        )
    _refuse_training_checkpoint(path)
    if is_hf_folder(path):
        # checked there: names, shapes against config.json, NaN/Inf; vocabulary padding comes when applied
        tensors, model, notes = load_hf_checkpoint(path, 33)
        return LoadedCheckpoint(path=path, tensors=tensors, model=model, notes=notes, source="huggingface")
    try:
        metadata = read_metadata(path)
    except Exception as error:  # SettingsError from the reader: re-raise as this module's error
        raise CheckpointError(str(error)) from None
    if "model" not in metadata:
        raise CheckpointError(f"checkpoint {path} has no model config in its metadata; was it written by bionemo?")
    try:
        tensors = read_weights(path)
    except Exception as error:
        raise CheckpointError(f"checkpoint {path} cannot be read (truncated or corrupted?): {error}") from None
    model = {**ESM_DEFAULTS, "vocab_size": metadata.get("vocab_size", 33), **metadata["model"]}
    check_tensors(tensors, model, f"checkpoint {path}")
    return LoadedCheckpoint(path=path, tensors=tensors, model=model, metadata=metadata)


def _refuse_training_checkpoint(path: Path) -> None:
    """Training checkpoints (Lightning ``.ckpt``, megatron ``step<N>/``) are for ``--resume``, not model weights."""
    megatron = path.is_dir() and (path / "weights" / "metadata.json").is_file()
    if path.suffix == ".ckpt" or megatron:
        run = path.parent.parent if path.parent.name == "checkpoints" else path.parent
        raise CheckpointError(
            f"{path} is a training checkpoint (it resumes training with --resume); --checkpoint takes model weights: "
            f"the model.safetensors a run exports (here {run / 'model.safetensors'}) or a Hugging Face folder"
        )
