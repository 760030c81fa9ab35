"""Model checkpoints a user passes with ``--checkpoint``: a Hugging Face ESM-2 folder or a bionemo safetensors file.

Everything is read and checked here, on the host, before any process group starts: unreadable files, missing
tensors, shapes that disagree with the config and NaN/Inf values each raise a :class:`CheckpointError` that
names the file and the tensor. ``bionemo.esm2.checkpoint_header`` makes the checks that need no tensor data
without importing torch; the CLI runs them before anything else.

A fine-tuned model (:attr:`LoadedCheckpoint.finetune` set) has no LM head: its encoder, LoRA factors and head
tensors are returned under the names of :mod:`bionemo.esm2.finetune.spec`.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bionemo.esm2.checkpoint_header import ESM_DEFAULTS, read_checkpoint_header
from bionemo.esm2.finetune.hf_tensors import load_hf_finetuned
from bionemo.esm2.finetune.layout import check_finetuned_layout
from bionemo.esm2.finetune.spec import FinetuneSpec
from bionemo.esm2.hf import CheckpointError, _check_finite, _tensor_info, check_bionemo_tensors, load_hf_checkpoint
from bionemo.esm2.hf_layout import CONTACT_HEAD
from bionemo.esm2.weights import read_weights

__all__ = ["ESM_DEFAULTS", "CheckpointError", "LoadedCheckpoint", "check_tensors", "load_checkpoint"]


@dataclass(frozen=True, kw_only=True)
class LoadedCheckpoint:
    """Whole model tensors (vocabulary unpadded), the model settings and what was noted while reading."""

    path: Path
    """The file or folder given."""
    tensors: dict[str, torch.Tensor]
    """bionemo tensor names (see ``bionemo.esm2.hf.bionemo_shapes``), float32 or as stored, on CPU; a fine-tuned
    model's encoder (no LM head), LoRA factors and ``head.*`` tensors (``bionemo.esm2.finetune.spec``)."""
    model: dict[str, Any]
    """``ESM2Config`` settings: shape, ``seq_length``, ``token_dropout``, layer-norm epsilon, dropout."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The bionemo file's metadata (recipe, training steps, validation perplexity); empty for Hugging Face."""
    notes: list[str] = field(default_factory=list)
    """One-line notes, e.g. Hugging Face tensors that are not model weights here (rotary buffers)."""
    source: str = "bionemo"
    """``"bionemo"`` or ``"huggingface"``."""
    finetune: FinetuneSpec | None = None
    """The fine-tuned model's task, head and labels; None for pretrained weights (with their LM head)."""

    @property
    def contact_head(self) -> bool:
        """Whether :attr:`tensors` hold the contact head (``bionemo.esm2.hf_layout.CONTACT_HEAD``, checked)."""
        return all(name in self.tensors for name in CONTACT_HEAD)


def check_tensors(
    tensors: dict[str, torch.Tensor], model: dict[str, Any], where: str, finetune: FinetuneSpec | None = None
) -> None:
    """Every tensor the model needs is there, with exactly the shape ``model`` implies, and finite.

    With ``finetune``, those of the fine-tuned model: encoder without LM head, LoRA factors, head
    (``bionemo.esm2.finetune.layout.check_finetuned_layout``).

    Raises:
        CheckpointError: ``where``, then the missing tensors, or the tensor with its shape and the expected one,
            or the tensor holding NaN/Inf (``bionemo.esm2.hf.check_bionemo_tensors``).
    """
    try:
        if finetune is None:
            check_bionemo_tensors(tensors, model, padded_vocab=False)
            return
        check_bionemo_tensors(tensors, model, padded_vocab=False, lm_head=False)
        check_finetuned_layout({name: _tensor_info(value) for name, value in tensors.items()}, model, finetune)
        for name, value in tensors.items():
            if value.is_floating_point():
                _check_finite(name, value)
    except CheckpointError as error:
        raise CheckpointError(f"{where}: {error}") from None


def load_checkpoint(path: Path) -> LoadedCheckpoint:
    """Read and check ``path``: a Hugging Face ESM-2 folder or a bionemo ``.safetensors`` file.

    The headers are checked first (``bionemo.esm2.checkpoint_header.read_checkpoint_header``), then the tensors
    are read and checked again, values included.

    Raises:
        CheckpointError: A missing path, an unusable folder or file (see :func:`check_tensors` and
            ``bionemo.esm2.hf``), or a bionemo file without its model config.
    """
    header = read_checkpoint_header(path)
    spec = header.finetune
    if header.source == "huggingface":
        # checked there: names, shapes against config.json, NaN/Inf; vocabulary padding comes when applied
        if spec is None:
            tensors, model, notes = load_hf_checkpoint(path, 33)
        else:
            tensors, model, notes = load_hf_finetuned(path, spec)
        return LoadedCheckpoint(
            path=path, tensors=tensors, model=model, notes=notes, source="huggingface", finetune=spec
        )
    try:
        tensors = read_weights(path)
    except Exception as error:
        raise CheckpointError(f"checkpoint {path} cannot be read (truncated or corrupted?): {error}") from None
    check_tensors(tensors, header.model, f"checkpoint {path}", spec)
    return LoadedCheckpoint(path=path, tensors=tensors, model=header.model, metadata=header.metadata, finetune=spec)
