"""Shared types, step contracts and small helpers for bionemo's Lightning layer.

The names below are imported on first use, so that ``import bionemo.core.<module>`` of a standard-library-only
module (``megatron_env``, ``cuda_devices``, ``safetensors_header``) does not import torch: the CLI checks its input
with them before anything heavy is imported.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bionemo.core.config import BionemoModelConfig, BionemoTrainableModelConfig
    from bionemo.core.device import compute_device, using_device
    from bionemo.core.types import DataStep, DataT, ForwardStep, LossT, ModelT, NestedTensors, ReductionT
    from bionemo.core.utils import get_dtype_device, some_first

__all__ = [
    "BionemoModelConfig",
    "BionemoTrainableModelConfig",
    "DataStep",
    "DataT",
    "ForwardStep",
    "LossT",
    "ModelT",
    "NestedTensors",
    "ReductionT",
    "compute_device",
    "get_dtype_device",
    "some_first",
    "using_device",
]

_MODULES = {
    "BionemoModelConfig": "config",
    "BionemoTrainableModelConfig": "config",
    "compute_device": "device",
    "using_device": "device",
    "DataStep": "types",
    "DataT": "types",
    "ForwardStep": "types",
    "LossT": "types",
    "ModelT": "types",
    "NestedTensors": "types",
    "ReductionT": "types",
    "get_dtype_device": "utils",
    "some_first": "utils",
}


def __getattr__(name: str) -> Any:
    """Import the public name ``name`` from its module on first use (PEP 562)."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'bionemo.core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"bionemo.core.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
