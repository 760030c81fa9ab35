"""Optimizers: the default Megatron one, and the torch optimizer that honours the same config off Megatron."""

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from megatron.core.optimizer import OptimizerConfig

if TYPE_CHECKING:
    from bionemo.lightning._nemo import MegatronOptimizerModule

__all__ = [
    "adam_step_options",
    "default_megatron_optimizer",
    "init_adam_state",
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


def torch_optimizer_from_config(config: OptimizerConfig, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The torch optimizer matching a megatron ``OptimizerConfig``, for Lightning's own strategies.

    ``"adam"`` maps to ``torch.optim.AdamW`` (megatron's Adam decouples weight decay) with ``lr``,
    ``weight_decay``, ``adam_beta1``/``adam_beta2`` and ``adam_eps``; ``"sgd"`` to ``torch.optim.SGD`` with
    ``lr``, ``weight_decay`` and ``sgd_momentum``. ``clip_grad`` is applied by ``BionemoLightningModule``.

    Raises:
        ValueError: For any other ``config.optimizer``.
    """
    params = [p for p in params if p.requires_grad]
    if config.optimizer == "adam":
        return torch.optim.AdamW(
            params,
            lr=config.lr if config.lr is not None else 1e-3,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            params,
            lr=config.lr if config.lr is not None else 1e-3,
            momentum=config.sgd_momentum,
            weight_decay=config.weight_decay,
        )
    raise ValueError(f"OptimizerConfig.optimizer={config.optimizer!r} is not supported; use 'adam' or 'sgd'")


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
