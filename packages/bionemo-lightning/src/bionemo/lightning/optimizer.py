"""Optimizers: the default Megatron one, and the torch optimizer that honours the same config off Megatron."""

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from megatron.core.optimizer import OptimizerConfig

if TYPE_CHECKING:
    from bionemo.lightning._nemo import MegatronOptimizerModule

__all__ = [
    "adam_step_options",
    "default_megatron_optimizer",
    "init_adam_state",
    "megatron_param_groups",
    "torch_adams",
    "torch_optimizer_from_config",
    "torch_optimizers",
]


def default_megatron_optimizer() -> "MegatronOptimizerModule":
    """Adam with learning rate 1e-4 and megatron's distributed optimizer (a NeMo ``MegatronOptimizerModule``)."""
    from bionemo.lightning._nemo import MegatronOptimizerModule

    return MegatronOptimizerModule(
        config=OptimizerConfig(lr=1e-4, optimizer="adam", use_distributed_optimizer=True),
    )


def torch_optimizer_from_config(
    config: OptimizerConfig,
    params: Iterable[torch.nn.Parameter] | Iterable[tuple[str, torch.nn.Parameter]],
    scale_lr_cond: Callable[[str, torch.nn.Parameter], bool] | None = None,
    lr_mult: float = 1.0,
) -> torch.optim.Optimizer:
    """The torch optimizer matching a megatron ``OptimizerConfig``, for Lightning's own strategies.

    ``"adam"`` maps to ``torch.optim.AdamW`` (megatron's Adam decouples weight decay) with ``lr``,
    ``weight_decay``, ``adam_beta1``/``adam_beta2`` and ``adam_eps``; ``"sgd"`` to ``torch.optim.SGD`` with
    ``lr``, ``weight_decay`` and ``sgd_momentum``. ``clip_grad`` is applied by ``BionemoLightningModule``.

    ``params`` as ``(name, parameter)`` pairs (``module.named_parameters()``) get megatron's parameter groups
    (:func:`megatron_param_groups`: no weight decay for biases and 1-D parameters); plain parameters form one
    group with ``weight_decay``. Parameters that do not require gradients are left out. ``scale_lr_cond`` and
    ``lr_mult`` are megatron's (and NeMo's ``MegatronOptimizerModule``'s): named parameters for which
    ``scale_lr_cond(name, param)`` holds go to groups whose ``lr_mult`` is ``lr_mult`` (others 1.0), which a
    schedule such as ``bionemo.recipes.schedules.WarmupCosine`` applies, as megatron's scheduler does.

    Raises:
        ValueError: For any other ``config.optimizer``.
    """
    groups = megatron_param_groups(params, config.weight_decay, scale_lr_cond, lr_mult)
    lr = config.lr if config.lr is not None else 1e-3
    if config.optimizer == "adam":
        return torch.optim.AdamW(
            groups, lr=lr, betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps, weight_decay=0.0
        )
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=config.sgd_momentum, weight_decay=0.0)
    raise ValueError(f"OptimizerConfig.optimizer={config.optimizer!r} is not supported; use 'adam' or 'sgd'")


def megatron_param_groups(
    params: Iterable[torch.nn.Parameter] | Iterable[tuple[str, torch.nn.Parameter]],
    weight_decay: float,
    scale_lr_cond: Callable[[str, torch.nn.Parameter], bool] | None = None,
    lr_mult: float = 1.0,
) -> list[dict[str, Any]]:
    """Parameter groups with megatron-core's weight-decay rule, as torch optimizers take them.

    megatron's ``_get_param_groups`` (without a ``no_weight_decay_cond``) exempts parameters whose name ends in
    ``.bias`` and every 1-D parameter (LayerNorm weights); the others decay by ``weight_decay``. Plain
    parameters (no names) all decay. Named parameters for which ``scale_lr_cond(name, param)`` holds form their
    own groups with ``"lr_mult": lr_mult`` (the others ``1.0``), as megatron's groups do. Groups keep the
    parameters' order; an empty group is left out.
    """
    grouped: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for item in params:
        name, param = item if isinstance(item, tuple) else (None, item)
        if not param.requires_grad:
            continue
        exempt = name is not None and (name.endswith(".bias") or param.dim() == 1)
        scaled = name is not None and scale_lr_cond is not None and bool(scale_lr_cond(name, param))
        grouped.setdefault((exempt, scaled), []).append(param)
    return [
        {
            "params": grouped[key],
            "weight_decay": 0.0 if key[0] else weight_decay,
            **({"lr_mult": lr_mult if key[1] else 1.0} if scale_lr_cond is not None else {}),
        }
        for key in ((False, False), (True, False), (False, True), (True, True))
        if key in grouped
    ]


def init_adam_state(optimizer: Any) -> None:
    """Create now the per-parameter state that torch Adam creates lazily at its first step.

    ``optimizer`` is a torch optimizer or any megatron / NeMo wrapper around one (NeMo's
    ``McoreDistributedOptimizer``, megatron's ``ChainedOptimizer``, ``DistributedOptimizer``); only the torch
    ``Adam``/``AdamW`` inside are touched, and only parameters without state. megatron-core 0.15.3 without
    Apex or TransformerEngine reads one ``step`` from every parameter's state when it builds the distributed
    optimizer's sharded state dict, which a checkpoint load does before any step: resuming ``fit`` into a fresh
    optimizer then fails (``assert len(steps) == 1``). The state made here (step 0, zero moments) is what the
    first step would make, so training is unchanged.
    """
    for inner in torch_adams(optimizer):
        for group in inner.param_groups:
            for param in group["params"]:
                state = inner.state[param]
                if state:
                    continue
                state["step"] = torch.zeros((), **adam_step_options(group, param.device))
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                if group.get("amsgrad"):
                    state["max_exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)


def adam_step_options(group: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """``dtype`` and ``device`` of torch Adam's ``step`` counter for a parameter on ``device`` in param ``group``.

    Where torch.optim.Adam keeps it: on the parameter's device for the fused or capturable kernels, else on the CPU;
    float64 when that is the default dtype, except for the fused kernels (float32).
    """
    fused = bool(group.get("fused"))
    on_device = fused or bool(group.get("capturable"))
    dtype = torch.float64 if torch.get_default_dtype() == torch.float64 and not fused else torch.float32
    return {"dtype": dtype, "device": device if on_device else torch.device("cpu")}


def torch_adams(optimizer: Any) -> Iterator[torch.optim.Adam | torch.optim.AdamW]:
    """The torch ``Adam`` / ``AdamW`` among :func:`torch_optimizers` of ``optimizer``."""
    for inner in torch_optimizers(optimizer):
        if isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            yield inner


def torch_optimizers(optimizer: Any) -> Iterator[torch.optim.Optimizer]:
    """The torch optimizers inside ``optimizer`` (itself, or those a NeMo / megatron wrapper holds, recursively)."""
    for attribute in ("mcore_optimizer", "chained_optimizers", "optimizer"):
        inner = getattr(optimizer, attribute, None)
        if inner is None:
            continue
        for each in inner if isinstance(inner, (list, tuple)) else [inner]:
            yield from torch_optimizers(each)
        return
    if isinstance(optimizer, torch.optim.Optimizer):
        yield optimizer
