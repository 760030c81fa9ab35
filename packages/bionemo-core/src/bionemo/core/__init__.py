"""Shared types, step contracts and small helpers for bionemo's Lightning layer."""

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
