"""Model checkpoints a user passes with ``--checkpoint``: a Hugging Face ESM-2 folder or a bionemo safetensors file.

:func:`load_checkpoint` reads one into tensors and settings; :func:`load_model` makes a ready model of it (for use
from Python: notebooks, scripts).

Everything is read and checked here, on the host, before any process group starts: unreadable files, missing
tensors, shapes that disagree with the config and NaN/Inf values each raise a :class:`CheckpointError` that
names the file and the tensor. ``bionemo.esm2.checkpoints.header`` makes the checks that need no tensor data
without importing torch; the CLI runs them before anything else.

A fine-tuned model (:attr:`LoadedCheckpoint.finetune` set) has no LM head: its encoder, LoRA factors and head
tensors are returned under the names of :mod:`bionemo.esm2.finetune.spec`.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bionemo.esm2.checkpoints.header import ESM_DEFAULTS, read_checkpoint_header
from bionemo.esm2.checkpoints.weights import apply_weights, read_weights
from bionemo.esm2.finetune.hf_tensors import load_hf_finetuned
from bionemo.esm2.finetune.layout import check_finetuned_layout
from bionemo.esm2.finetune.spec import FinetuneSpec
from bionemo.esm2.hf.files import check_bionemo_tensors, check_finite, load_hf_checkpoint, tensor_info
from bionemo.esm2.hf.layout import CONTACT_HEAD, CheckpointError

__all__ = ["ESM_DEFAULTS", "CheckpointError", "LoadedCheckpoint", "check_tensors", "load_checkpoint", "load_model"]


@dataclass(frozen=True, kw_only=True)
class LoadedCheckpoint:
    """Whole model tensors (vocabulary unpadded), the model settings and what was noted while reading."""

    path: Path
    """The file or folder given."""
    tensors: dict[str, torch.Tensor]
    """bionemo tensor names (see ``bionemo.esm2.hf.layout.bionemo_shapes``), float32 or as stored, on CPU; a fine-tuned
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
        """Whether :attr:`tensors` hold the contact head (``bionemo.esm2.hf.layout.CONTACT_HEAD``, checked)."""
        return all(name in self.tensors for name in CONTACT_HEAD)


def check_tensors(
    tensors: dict[str, torch.Tensor], model: dict[str, Any], where: str, finetune: FinetuneSpec | None = None
) -> None:
    """Every tensor the model needs is there, with exactly the shape ``model`` implies, and finite.

    With ``finetune``, those of the fine-tuned model: encoder without LM head, LoRA factors, head
    (``bionemo.esm2.finetune.layout.check_finetuned_layout``).

    Raises:
        CheckpointError: ``where``, then the missing tensors, or the tensor with its shape and the expected one,
            or the tensor holding NaN/Inf (``bionemo.esm2.hf.files.check_bionemo_tensors``).
    """
    try:
        if finetune is None:
            check_bionemo_tensors(tensors, model, padded_vocab=False)
            return
        check_bionemo_tensors(tensors, model, padded_vocab=False, lm_head=False)
        check_finetuned_layout({name: tensor_info(value) for name, value in tensors.items()}, model, finetune)
        for name, value in tensors.items():
            check_finite(name, value)  # integer tensors pass
    except CheckpointError as error:
        raise CheckpointError(f"{where}: {error}") from None


def load_checkpoint(path: Path) -> LoadedCheckpoint:
    """Read and check ``path``: a Hugging Face ESM-2 folder or a bionemo ``.safetensors`` file.

    The headers are checked first (``bionemo.esm2.checkpoints.header.read_checkpoint_header``), then the tensors
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


def load_model(path: Path | str, *, device: str = "cpu"):
    """An :class:`~bionemo.esm2.model.esm2.ESM2Model` in eval mode with the weights of ``path``, on ``device``.

    ``path`` is a Hugging Face ESM-2 folder or a bionemo ``.safetensors`` file (see
    :func:`load_checkpoint`). Sets up megatron's parallel state for one process
    (tensor / pipeline parallel size 1) if nothing else has.

    Raises:
        CheckpointError: The checkpoint cannot be used (the message says why).
    """
    from bionemo.core.megatron_env import prepare_megatron_import

    prepare_megatron_import()
    from bionemo.esm2.model.esm2 import ESM2Config
    from bionemo.lightning import ensure_model_parallel

    checkpoint = load_checkpoint(Path(path))
    ensure_model_parallel()
    model = ESM2Config(**checkpoint.model).configure_model()
    apply_weights(model, checkpoint.tensors)
    return model.to(device).eval()
