"""Speed-up: megatron-core's gradient norm and scale fallbacks as torch ``_foreach`` kernels, without GPU waits.

Without Apex or TransformerEngine, megatron-core 0.15.3's gradient-norm fallback (``local_multi_tensor_l2_norm``)
launches one norm kernel per gradient and turns each result into a Python float, which waits for the GPU once
per parameter tensor on every step (docs/benchmarks.md#module-against-a-raw-megatron-core-loop); its scale
fallback (``local_multi_tensor_scale``: grad clipping, main-to-model param copies) launches two kernels per tensor.
:func:`install` swaps both for torch's ``_foreach`` kernels (:func:`foreach_l2_norm`, :func:`foreach_scale`),
which compute the same values with one wait-free launch per tensor group. Only the fallbacks are replaced: where
megatron found Apex's or TransformerEngine's fused kernels, those stay. Applied for ``fit`` only; restored at
teardown. The gain of this switch alone on a GPU step is not measured yet (the module-vs-raw-loop figures of
docs/benchmarks.md ran both loops with it). Off: ``MegatronCompatCallback(skip=["multi_tensor_foreach"])``.
"""

import types
from typing import Any

import torch

from bionemo.lightning.workarounds.workaround import Patches, Workaround

__all__ = ["MULTI_TENSOR_FOREACH", "foreach_l2_norm", "foreach_scale", "install"]

_foreach = types.SimpleNamespace(
    # torch's multi-tensor kernels (what torch.optim uses); pyright flags them as private to torch
    norm=torch._foreach_norm,  # pyright: ignore[reportPrivateImportUsage]
    mul=torch._foreach_mul,  # pyright: ignore[reportPrivateImportUsage]
    mul_=torch._foreach_mul_,  # pyright: ignore[reportPrivateImportUsage]
    copy_=torch._foreach_copy_,  # pyright: ignore[reportPrivateImportUsage]
)


def foreach_l2_norm(
    chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]], per_tensor: bool, *args: Any
) -> tuple[torch.Tensor, None]:
    """The L2 norm of all tensors in ``tensor_lists`` as a one-element fp32 tensor, without waiting on the GPU.

    Same arguments and result as megatron's ``local_multi_tensor_l2_norm`` (``chunk_size`` and ``noop_flag``
    are unused, as there; no per-tensor norms).
    """
    tensors = [tensor for tensor_list in tensor_lists for tensor in tensor_list]
    if not tensors:
        return torch.zeros(1, dtype=torch.float32, device=noop_flag.device), None
    norms = _foreach.norm(tensors, 2, dtype=torch.float32)
    return torch.linalg.vector_norm(torch.stack(norms)).reshape(1), None


def foreach_scale(
    chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]], scale: float
) -> None:
    """``dst = src * scale`` for each pair of ``tensor_lists = [srcs, dsts]``, like ``local_multi_tensor_scale``."""
    sources, targets = tensor_lists
    if not targets:
        return
    if all(source is target for source, target in zip(sources, targets, strict=True)):
        _foreach.mul_(targets, scale)
    elif scale == 1.0:
        _foreach.copy_(targets, sources)
    else:
        _foreach.copy_(targets, _foreach.mul(sources, scale))


def install(patches: Patches) -> None:
    """Point megatron's optimizer modules at :func:`foreach_l2_norm` / :func:`foreach_scale` for the fallbacks."""
    from megatron.core import optimizer as optimizer_package
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads

    if clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm:
        patches.set(clip_grads, "l2_norm_impl", foreach_l2_norm)
    modules: tuple[Any, ...] = (clip_grads, optimizer_package.optimizer)
    for module in modules:
        if module.multi_tensor_scale_impl is utils.local_multi_tensor_scale:
            patches.set(module, "multi_tensor_scale_impl", foreach_scale)


MULTI_TENSOR_FOREACH = Workaround(
    name="multi_tensor_foreach",
    upstream="megatron-core's multi-tensor fallbacks wait for the GPU once per gradient tensor per step",
    verified={"megatron-core": "0.15.3"},
    sources={
        "megatron.core.utils:local_multi_tensor_l2_norm": "01526c55444a73bd",
        "megatron.core.utils:local_multi_tensor_scale": "a271d86b61250d2f",
        "megatron.core.optimizer.clip_grads:get_grad_norm_fp32": "7fa2ba2493d43f1d",
        "megatron.core.optimizer.clip_grads:clip_grad_by_total_norm_fp32": "8edb9da5365045a5",
        "megatron.core.optimizer.optimizer:_multi_tensor_copy_this_to_that": "2788b0572db3ae06",
    },
    stages=frozenset({"fit"}),
    speed_up=True,
    install=install,
)
