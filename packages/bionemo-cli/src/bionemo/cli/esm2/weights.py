"""Model weights as safetensors (no pickle), with the model config in the file's metadata."""

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from bionemo.callbacks import save_safetensors_atomically
from bionemo.cli.settings import SettingsError

__all__ = ["apply_weights", "read_metadata", "read_weights", "save_weights"]


def save_weights(model: torch.nn.Module, path: Path, metadata: dict[str, Any]) -> None:
    """Write the model's tensors (``_extra_state`` entries left out) and JSON ``metadata`` atomically."""
    tensors = {
        name: value.detach().to("cpu").contiguous().clone()
        for name, value in model.state_dict().items()
        if isinstance(value, torch.Tensor) and not name.endswith("_extra_state")
    }
    save_safetensors_atomically(tensors, path, {key: json.dumps(value) for key, value in metadata.items()})


def read_metadata(path: Path) -> dict[str, Any]:
    """The JSON metadata of a weights file.

    Raises:
        SettingsError: Missing file or not a readable safetensors file.
    """
    if not path.is_file():
        raise SettingsError(f"checkpoint {path} does not exist", "--checkpoint")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = f.metadata() or {}
        return {key: json.loads(value) for key, value in raw.items()}
    except Exception as error:
        raise SettingsError(f"checkpoint {path} is not a readable safetensors file: {error}", "--checkpoint") from None


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a weights file, on CPU."""
    tensors = {}
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            tensors[key] = f.get_tensor(key)
    return tensors


def apply_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy full (unsharded) ``tensors`` into ``model``, slicing tensor-parallel parameters for this rank.

    Raises:
        ValueError: A model parameter is missing from the file or has an incompatible shape.
    """
    from megatron.core import parallel_state

    tp_size = (
        parallel_state.get_tensor_model_parallel_world_size() if parallel_state.model_parallel_is_initialized() else 1
    )
    tp_rank = parallel_state.get_tensor_model_parallel_rank() if tp_size > 1 else 0
    state = model.state_dict()
    missing = [name for name in state if not name.endswith("_extra_state") and name not in tensors]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} model tensors, e.g. {missing[:3]}")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, target in state.items():
            if name.endswith("_extra_state"):
                continue
            source = tensors[name]
            param = params.get(name)
            if param is not None and getattr(param, "tensor_model_parallel", False) and tp_size > 1:
                source = source.chunk(tp_size, dim=getattr(param, "partition_dim", 0))[tp_rank]
            if source.shape != target.shape:
                raise ValueError(
                    f"checkpoint tensor {name} has shape {tuple(source.shape)}, model needs {tuple(target.shape)}"
                )
            target.copy_(source)
