"""Model weights as safetensors (no pickle), with the model config in the file's metadata.

Files hold whole (unsharded) tensors with exactly ``vocab_size`` vocabulary rows: the padding megatron's
vocab-parallel layers need depends on the tensor-parallel size and is added when weights are applied. Names are
the whole model's (``decoder.layers.0`` .. ``decoder.layers.{num_layers - 1}``), whatever pipeline stage holds a
layer (:mod:`bionemo.esm2.model.pipeline`); files never hold the last stage's copy of the tied word embeddings
(:data:`TIED_COPIES`).
"""

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from bionemo.core.safetensors_io import save_safetensors_atomically
from bionemo.esm2.hf.layout import CheckpointError
from bionemo.esm2.model.pipeline import gather_stages, pipeline_group, whole_model_names

__all__ = [
    "TIED_COPIES",
    "VOCAB_ROWS",
    "apply_weights",
    "full_state_dict",
    "read_metadata",
    "read_weights",
    "save_weights",
    "unpadded",
]

VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.bias")
"""Tensors with one row per vocabulary entry (padded inside the model, exactly ``vocab_size`` rows in files)."""

TIED_COPIES = {"output_layer.weight": "embedding.word_embeddings.weight"}
"""Copies of a tied tensor, by the name of what they copy. Under pipeline parallelism the last stage holds its own
copy of the word embeddings for the LM head's projection (megatron's ``share_embeddings_and_output_weights``: the
copy is marked ``shared`` and kept equal to the first stage's); with one stage the model holds no copy at all."""


def unpadded(tensors: Mapping[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """``tensors`` with the vocabulary rows cut back to ``vocab_size`` (what files hold)."""
    return {name: value[:vocab_size] if name in VOCAB_ROWS else value for name, value in tensors.items()}


def _tensor_parallel() -> tuple[int, int, Any]:
    """(size, rank, group) of megatron's tensor-parallel group; (1, 0, None) without one."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1, 0, None
    size = parallel_state.get_tensor_model_parallel_world_size()
    if size == 1:
        return 1, 0, None
    return size, parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_group()


def _communication_device(group: Any) -> torch.device:
    """Where tensors travel through ``group``: the current CUDA device for NCCL, else the CPU."""
    import torch.distributed as dist

    if group is not None and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _is_tied_copy(name: str, param: torch.nn.Parameter | None) -> bool:
    """Whether ``name`` is a pipeline stage's copy of a tied tensor (see :data:`TIED_COPIES`)."""
    return name in TIED_COPIES and param is not None and getattr(param, "shared", False)


def _parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The parameters by their state-dict names.

    Wrappers that rename keys in their state dict (LoRA adapters keep their base layer's ``weight`` where the
    unwrapped layer had it) are followed, which ``named_parameters`` is not.
    """
    return {n: v for n, v in model.state_dict(keep_vars=True).items() if isinstance(v, torch.nn.Parameter)}


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's tensors on CPU under whole-model names, on every rank.

    Tensor-parallel shards are gathered into full tensors (vocabulary rows still padded, see :func:`unpadded`);
    under pipeline parallelism every stage's tensors are gathered too, each layer named by its global number,
    and the last stage's copy of the tied word embeddings is left out (:data:`TIED_COPIES`). A collective under
    tensor and pipeline parallelism: every rank of the tensor- and pipeline-parallel groups must call it.
    """
    import torch.distributed as dist

    size, _, group = _tensor_parallel()
    # Lightning moves the module to the CPU when fit ends; NCCL gathers only CUDA tensors
    gather_on = _communication_device(group if size > 1 else None)
    params = _parameters(model)
    whole_name = whole_model_names(model)
    stage = {}
    for name, value in model.state_dict().items():
        if not isinstance(value, torch.Tensor) or name.endswith("_extra_state"):
            continue
        param = params.get(name)
        if _is_tied_copy(name, param):
            continue
        if size > 1 and param is not None and getattr(param, "tensor_model_parallel", False):
            value = value.to(gather_on).contiguous()
            shards = [torch.empty_like(value) for _ in range(size)]
            dist.all_gather(shards, value, group=group)
            value = torch.cat(shards, dim=getattr(param, "partition_dim", 0))
        stage[whole_name(name)] = value.detach().to("cpu").contiguous().clone()
    stages = pipeline_group()
    return gather_stages(stage, stages, _communication_device(stages))


def save_weights(tensors: Mapping[str, torch.Tensor], path: Path, metadata: Mapping[str, Any]) -> None:
    """Write full (see :func:`full_state_dict`) model tensors and JSON ``metadata`` atomically.

    Vocabulary rows are cut to ``metadata["model"]["vocab_size"]`` (default 33).
    """
    vocab = metadata.get("model", {}).get("vocab_size", 33)
    save_safetensors_atomically(
        unpadded(tensors, vocab), path, {key: json.dumps(value) for key, value in metadata.items()}
    )


def read_metadata(path: Path) -> dict[str, Any]:
    """The JSON metadata of a weights file.

    Raises:
        CheckpointError: Missing file or not a readable safetensors file.
    """
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = f.metadata() or {}
        return {key: json.loads(value) for key, value in raw.items()}
    except Exception as error:
        raise CheckpointError(f"checkpoint {path} is not a readable safetensors file: {error}") from None


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a weights file, on CPU."""
    tensors = {}
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            tensors[key] = f.get_tensor(key)
    return tensors


def apply_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy whole-model ``tensors`` (unsharded, whole-model names) into ``model``, this rank's share of them.

    Each tensor-parallel parameter gets this rank's slice; under pipeline parallelism each layer of this stage
    takes the file's tensors of its global number, and the last stage's copy of the tied word embeddings takes
    the word embeddings (:data:`TIED_COPIES`). Vocabulary rows (:data:`VOCAB_ROWS`) shorter than the model's
    padded table are padded with zeros. No collective: each rank reads what it needs from ``tensors``.

    Raises:
        ValueError: A model parameter is missing from the file or has an incompatible shape.
    """
    tp_size, tp_rank, _ = _tensor_parallel()
    state = model.state_dict()
    whole_name = whole_model_names(model)
    sources = {}
    for name in state:
        if name.endswith("_extra_state"):
            continue
        source = whole_name(name)
        sources[name] = TIED_COPIES[source] if source in TIED_COPIES and source not in tensors else source
    missing = [source for source in sources.values() if source not in tensors]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} model tensors, e.g. {missing[:3]}")
    params = _parameters(model)
    with torch.no_grad():
        for name, source_name in sources.items():
            target = state[name]
            source = tensors[source_name]
            param = params.get(name)
            if source_name in VOCAB_ROWS and source.shape[0] < tp_size * target.shape[0]:
                padding = source.new_zeros((tp_size * target.shape[0] - source.shape[0], *source.shape[1:]))
                source = torch.cat([source, padding])
            if param is not None and getattr(param, "tensor_model_parallel", False) and tp_size > 1:
                source = source.chunk(tp_size, dim=getattr(param, "partition_dim", 0))[tp_rank]
            if source.shape != target.shape:
                raise ValueError(
                    f"checkpoint tensor {source_name} has shape {tuple(source.shape)}, {name} of this model needs "
                    f"{tuple(target.shape)}"
                )
            target.copy_(source)
