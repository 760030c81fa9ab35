"""Optimizers: the default Megatron one, and the torch optimizer that honours the same config off Megatron."""

from collections.abc import Iterable

import torch
from megatron.core.optimizer import OptimizerConfig

from bionemo.lightning._nemo import MegatronOptimizerModule

__all__ = ["default_megatron_optimizer", "torch_optimizer_from_config"]


def default_megatron_optimizer() -> MegatronOptimizerModule:
    """Adam with learning rate 1e-4 and megatron's distributed optimizer."""
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
