"""Speed-up: megatron-core's torch Adam fallback as torch's fused CUDA kernel rather than its multi-tensor one.

Without Apex or TransformerEngine, megatron-core 0.15.3 builds the optimizer as ``torch.optim.AdamW`` (or ``Adam``)
with torch's default implementation: the multi-tensor ("foreach") kernels, a dozen passes over the fp32 main
parameters, gradients and moments per step, and a host-side step counter per parameter. torch's ``fused=True``
AdamW makes one pass (one kernel per group of tensors) with the counters on the GPU; the update is the same
AdamW. :func:`fuse_adam` switches the optimizer's param groups whose parameters are all floating-point CUDA
tensors to it and moves their ``step`` counters to the GPU, at the start of training: after a checkpoint's
optimizer state is loaded (whose param groups carry the settings of the run that saved it). It changes this run's
optimizer only, nothing process-wide. Where megatron found Apex's or TransformerEngine's fused Adam, nothing
changes.

It cuts Adam's GPU time per step (docs/benchmarks.md#training-throughput-as-a-share-of-peak). Off:
``MegatronCompatCallback(skip=["fused_adam"])`` or ``BIONEMO_SKIP_WORKAROUNDS=fused_adam``.
"""

from collections.abc import Iterable
from typing import Any

import torch

from bionemo.lightning.optimizer import adam_step_options, torch_adams
from bionemo.lightning.workarounds.workaround import Workaround

__all__ = ["FUSED_ADAM", "fuse_adam"]


def fuse_adam(optimizers: Iterable[Any]) -> int:
    """Run every torch ``Adam`` / ``AdamW`` inside ``optimizers`` (megatron or NeMo wrappers too) fused, where it can.

    A param group is switched when it is not fused already, not ``differentiable``, and all its parameters are
    floating-point CUDA tensors; each of its parameters' ``step`` counters becomes the parameter's own fp32 tensor on
    its device, as torch's fused Adam keeps them.

    Returns:
        How many param groups were switched.
    """
    switched = 0
    for optimizer in optimizers:
        for inner in torch_adams(optimizer):
            for group in inner.param_groups:
                if not _can_fuse(group):
                    continue
                group["fused"] = True
                group["foreach"] = False
                for param in group["params"]:
                    state = inner.state.get(param)
                    if state and "step" in state:
                        options = adam_step_options(group, param.device)
                        state["step"] = state["step"].detach().to(copy=True, **options)
                switched += 1
    return switched


def _can_fuse(group: dict[str, Any]) -> bool:
    params = group["params"]
    if group.get("fused") or group.get("differentiable") or not params:
        return False
    return all(param.is_cuda and torch.is_floating_point(param) for param in params)


FUSED_ADAM = Workaround(
    name="fused_adam",
    upstream="megatron-core without Apex/TransformerEngine steps torch Adam with its multi-tensor kernels, not fused",
    verified={"megatron-core": "0.15.3"},
    sources={
        "megatron.core.optimizer:_get_megatron_optimizer_based_on_param_groups": "54494923fd238ea8",
    },
    stages=frozenset({"fit"}),
    speed_up=True,
)
