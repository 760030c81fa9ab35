"""One pipeline stage's tensors under whole-model names, and the whole model gathered from every stage.

Under pipeline parallelism megatron builds on each stage only its share of the layers and numbers them locally:
with 4 layers over 2 stages both stages hold ``decoder.layers.0`` and ``decoder.layers.1``. Each
``TransformerLayer`` knows its place in the whole model (``layer_number``, 1-based and global), so a stage's
state-dict names translate into the whole model's (``decoder.layers.{layer_number - 1}``), which are the names
files hold. Without pipeline parallelism the translation is the identity.
"""

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["gather_stages", "pipeline_group", "whole_model_names"]

_LAYER = re.compile(r"^(?P<prefix>(?:.+\.)?layers)\.\d+$")
"""A transformer layer's module name: ``...layers.<local index>``."""


def pipeline_group() -> Any:
    """Megatron's pipeline-parallel group of the calling rank; ``None`` without one or for a single stage."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return None
    if parallel_state.get_pipeline_model_parallel_world_size() == 1:
        return None
    return parallel_state.get_pipeline_model_parallel_group()


def whole_model_names(model: torch.nn.Module) -> Callable[[str], str]:
    """A function from ``model``'s state-dict names to the whole model's names.

    A name under a transformer layer (a module named ``<prefix>.layers.<i>`` with an int ``layer_number``, as
    megatron's ``TransformerLayer`` has) gets that layer's global index ``layer_number - 1``; every other name
    is kept as it is.
    """
    renames: dict[str, str] = {}
    for name, module in model.named_modules():
        number = getattr(module, "layer_number", None)
        match = _LAYER.match(name)
        if match is not None and isinstance(number, int):
            renames[f"{name}."] = f"{match['prefix']}.{number - 1}."

    def whole(name: str) -> str:
        for local, global_ in renames.items():
            if name.startswith(local):
                return global_ + name[len(local) :]
        return name

    return whole


def gather_stages(tensors: Mapping[str, torch.Tensor], group: Any, device: torch.device) -> dict[str, torch.Tensor]:
    """Every stage's ``tensors`` (under whole-model names) on every rank of the pipeline ``group``, on CPU.

    A collective: every rank of ``group`` must call it. Each stage's names, shapes and dtypes go round first, then
    each tensor is broadcast from its stage through ``device`` (a CUDA device for NCCL, the CPU for gloo). With
    ``group=None`` (one stage) the result is ``tensors`` on CPU.

    Raises:
        ValueError: Two stages hold a tensor of the same name (a layer numbered alike on both).
    """
    if group is None:
        return {name: value.detach().to("cpu") for name, value in tensors.items()}
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    layouts: list[Any] = [None] * size
    dist.all_gather_object(layouts, [(name, value.shape, value.dtype) for name, value in tensors.items()], group=group)
    whole: dict[str, torch.Tensor] = {}
    for stage, layout in enumerate(layouts):
        for name, shape, dtype in layout:
            if name in whole:
                raise ValueError(f"pipeline stages hold {name} twice (stage {stage} and an earlier one)")
            if stage == rank:
                buffer = tensors[name].detach().to(device).contiguous()
            else:
                buffer = torch.empty(shape, dtype=dtype, device=device)
            dist.broadcast(buffer, src=dist.get_global_rank(group, stage), group=group)
            whole[name] = buffer.to("cpu")
    return whole
