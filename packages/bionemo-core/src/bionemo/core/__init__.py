"""Shared types, step contracts and small helpers for bionemo's Lightning layer.

The names below are imported on first use, so that ``import bionemo.core.<module>`` of a standard-library-only
module (``megatron_env``, ``cuda_devices``, ``safetensors_header``) does not import torch: the CLI checks its input
with them before anything heavy is imported.
"""

from typing import TYPE_CHECKING

from bionemo.core.lazy_exports import lazy_exports

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

__getattr__ = lazy_exports(
    __name__,
    {
        "config": ("BionemoModelConfig", "BionemoTrainableModelConfig"),
        "device": ("compute_device", "using_device"),
        "types": ("DataStep", "DataT", "ForwardStep", "LossT", "ModelT", "NestedTensors", "ReductionT"),
        "utils": ("get_dtype_device", "some_first"),
    },
)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
