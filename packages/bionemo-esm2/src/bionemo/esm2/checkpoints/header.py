"""A ``--checkpoint`` checked from its headers alone: no tensor data is read and nothing heavy is imported.

:func:`read_checkpoint_header` refuses a missing path, a training checkpoint, a Hugging Face folder whose
``config.json`` or weight files are unusable, and a bionemo ``.safetensors`` file that is not a complete
safetensors file or lacks its model config, and checks every tensor's name, shape and type against the model
settings, all from ``config.json``, shard indexes and safetensors headers. What only the values show (NaN/Inf,
a damaged ``pytorch_model.bin``) is found when :func:`bionemo.esm2.checkpoints.load.load_checkpoint` reads them.

Fine-tuned models are read too: a bionemo file whose metadata holds
:data:`~bionemo.esm2.finetune.spec.FINETUNE_KEY` (encoder without LM head, LoRA factors, head:
:mod:`bionemo.esm2.finetune.layout`), and a Hugging Face ``EsmFor{Sequence,Token}Classification`` folder
(:mod:`bionemo.esm2.finetune.hf_heads`); :attr:`CheckpointHeader.finetune` says which model it is.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bionemo.core.safetensors_header import (
    FLOATING_POINT_DTYPES,
    TORCH_DTYPE_NAMES,
    SafetensorsHeader,
    SafetensorsHeaderError,
    read_safetensors_header,
)
from bionemo.esm2.catalog import ESM_DEFAULTS
from bionemo.esm2.finetune.hf_heads import HF_HEAD_PREFIX, check_hf_head_layout, read_hf_finetune_spec
from bionemo.esm2.finetune.layout import check_finetuned_layout, read_finetune_spec
from bionemo.esm2.finetune.spec import FinetuneSpec
from bionemo.esm2.hf.layout import (
    CONTACT_HEAD,
    HF_WEIGHT_FILES,
    CheckpointError,
    TensorInfo,
    check_bionemo_layout,
    check_hf_layout,
    hf_index_shards,
    is_hf_folder,
    read_hf_config,
)

__all__ = ["ESM_DEFAULTS", "CheckpointHeader", "read_checkpoint_header", "refuse_training_checkpoint"]


@dataclass(frozen=True, kw_only=True)
class CheckpointHeader:
    """What a checkpoint's headers say: the model settings, the bionemo metadata and the kind of checkpoint."""

    path: Path
    """The file or folder given."""
    model: dict[str, Any]
    """``ESM2Config`` settings: shape, ``seq_length``, ``token_dropout``, layer-norm epsilon, dropout."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The bionemo file's metadata (recipe, training steps, validation perplexity); empty for Hugging Face."""
    source: str = "bionemo"
    """``"bionemo"`` or ``"huggingface"``."""
    contact_head: bool | None = False
    """Whether the checkpoint holds a contact head (``bionemo.esm2.hf.layout.CONTACT_HEAD``); None where the
    headers cannot tell (a Hugging Face ``pytorch_model.bin``: known once its tensors are read)."""
    finetune: FinetuneSpec | None = None
    """The fine-tuned model's task, head and labels; None for pretrained weights (with their LM head)."""


def read_checkpoint_header(path: Path) -> CheckpointHeader:
    """Check ``path`` (a Hugging Face ESM-2 folder or a bionemo ``.safetensors`` file) without reading tensors.

    A fine-tuned model (a bionemo file with fine-tuning metadata, a Hugging Face classification folder) has no
    LM head; its encoder, LoRA factors and head are checked instead (:attr:`CheckpointHeader.finetune`).

    Raises:
        CheckpointError: A missing path, a training checkpoint, an unusable ``config.json``, no or unreadable
            weight files (truncated, not safetensors, a shard index naming missing shards), a bionemo file without
            its model config or with malformed fine-tuning metadata, or tensors missing or of the wrong shape or
            type for the model settings.
    """
    if not path.exists():
        raise CheckpointError(
            f"checkpoint {path} does not exist; give a Hugging Face ESM-2 folder (config.json + model.safetensors "
            "or pytorch_model.bin) or a bionemo model.safetensors"
        )
    refuse_training_checkpoint(path)
    _refuse_run_folder(path)
    if is_hf_folder(path):
        return _hf_header(path)
    return _bionemo_header(path)


def refuse_training_checkpoint(path: Path) -> None:
    """Training checkpoints (Lightning ``.ckpt``, megatron ``step<N>/``) resume their run, they are not model weights.

    Raises:
        CheckpointError: ``path`` is one, naming the weights file the run exported instead.
    """
    megatron = path.is_dir() and (path / "weights" / "metadata.json").is_file()
    if path.suffix == ".ckpt" or megatron:
        run = path.parent.parent if path.parent.name == "checkpoints" else path.parent
        raise CheckpointError(
            f"{path} is a training checkpoint (the command that wrote it, rerun with --output-dir {run}, resumes "
            "from it); "
            "--checkpoint takes model weights: "
            f"the model.safetensors a run exports (here {run / 'model.safetensors'}) or a Hugging Face folder"
        )


def _refuse_run_folder(path: Path) -> None:
    """A ``run train`` / ``run finetune`` output folder is not a Hugging Face folder: name the weights file in it.

    Raises:
        CheckpointError: ``path`` is a folder without ``config.json`` whose ``model.safetensors`` is bionemo's.
    """
    weights = path / "model.safetensors"
    if not path.is_dir() or (path / "config.json").exists() or not weights.is_file():
        return
    try:
        metadata = read_safetensors_header(weights).metadata
    except (OSError, SafetensorsHeaderError):
        return
    if "model" in metadata:
        raise CheckpointError(
            f"{path} is a bionemo run's folder, not a Hugging Face one (it has no config.json): --checkpoint takes "
            f"the weights file the run exported, {weights}"
        )


def _layout(header: SafetensorsHeader) -> dict[str, TensorInfo]:
    """Each tensor of a safetensors file, as its header describes it.

    Types are named as torch prints them (``torch.float32``), so the messages match those of the tensor checks;
    a type outside :data:`~bionemo.core.safetensors_header.TORCH_DTYPE_NAMES` keeps its safetensors name and counts
    as floating point (the ``F8_*`` types).
    """
    return {
        name: TensorInfo(
            f"torch.{TORCH_DTYPE_NAMES[e.dtype]}" if e.dtype in TORCH_DTYPE_NAMES else e.dtype,
            e.shape,
            e.dtype in FLOATING_POINT_DTYPES or e.dtype not in TORCH_DTYPE_NAMES,
        )
        for name, e in header.tensors.items()
    }


def _hf_file_layout(path: Path) -> dict[str, TensorInfo] | None:
    """The tensors of one Hugging Face weight file; None for ``.bin`` files (torch pickles: read later)."""
    if not path.name.endswith(".safetensors"):
        return None
    try:
        return _layout(read_safetensors_header(path))
    except (OSError, SafetensorsHeaderError) as error:
        raise CheckpointError(f"{path} cannot be read (truncated or corrupted?): {error}") from None


def _hf_layout(folder: Path) -> dict[str, TensorInfo] | None:
    """The tensors of a Hugging Face folder's weights (looked for as ``read_hf_tensors`` does), None if unknown."""
    for name in HF_WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return _hf_file_layout(path)
        tensors: dict[str, TensorInfo] = {}
        for shard in hf_index_shards(path):
            layout = _hf_file_layout(shard)
            if layout is None:
                return None
            tensors.update(layout)
        return tensors
    raise CheckpointError(f"Hugging Face folder {folder} has no weights; it needs one of {', '.join(HF_WEIGHT_FILES)}")


def _hf_header(folder: Path) -> CheckpointHeader:
    model = read_hf_config(folder)
    spec = read_hf_finetune_spec(folder)
    layout = _hf_layout(folder)
    contact_head = None
    if layout is not None:
        try:
            if spec is None:
                found = check_hf_layout(layout, model)
            else:
                head = {name: info for name, info in layout.items() if name.startswith(HF_HEAD_PREFIX)}
                encoder = {name: info for name, info in layout.items() if name not in head}
                check_hf_head_layout(head, spec, int(model["hidden_size"]))
                found = check_hf_layout(encoder, model, lm_head=False)
        except CheckpointError as error:
            raise CheckpointError(f"Hugging Face checkpoint {folder}: {error}") from None
        contact_head = all(name in found for name in CONTACT_HEAD)
    return CheckpointHeader(path=folder, model=model, source="huggingface", contact_head=contact_head, finetune=spec)


def _bionemo_header(path: Path) -> CheckpointHeader:
    try:
        header = read_safetensors_header(path)
    except (OSError, SafetensorsHeaderError) as error:
        raise CheckpointError(f"checkpoint {path} is not a readable safetensors file: {error}") from None
    # Hugging Face's names: ``esm.`` (EsmForMaskedLM, EsmFor*Classification) or ``encoder.layer.`` (EsmModel)
    if any(name.startswith(("esm.", "encoder.layer.")) for name in header.tensors):
        folder = path.parent
        where = f"its folder {folder}" if (folder / "config.json").is_file() else "the folder it came in"
        raise CheckpointError(
            f"{path} is a Hugging Face weights file; --checkpoint takes the whole Hugging Face folder (config.json, "
            f"weights, vocab.txt): give {where}"
        )
    try:
        metadata = {key: json.loads(value) for key, value in header.metadata.items()}
    except json.JSONDecodeError:
        metadata = {}
    if not isinstance(metadata.get("model"), dict):
        raise CheckpointError(f"checkpoint {path} has no model config in its metadata; was it written by bionemo?")
    model = {**ESM_DEFAULTS, "vocab_size": metadata.get("vocab_size", ESM_DEFAULTS["vocab_size"]), **metadata["model"]}
    spec = read_finetune_spec(metadata, f"checkpoint {path}")
    try:
        if spec is None:
            contact_head = check_bionemo_layout(_layout(header), model, padded_vocab=False)
        else:
            contact_head = check_finetuned_layout(_layout(header), model, spec)
    except CheckpointError as error:
        raise CheckpointError(f"checkpoint {path}: {error}") from None
    return CheckpointHeader(path=path, model=model, metadata=metadata, contact_head=contact_head, finetune=spec)
