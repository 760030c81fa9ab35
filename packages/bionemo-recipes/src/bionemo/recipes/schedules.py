"""Learning-rate schedules for the recipes, usable as NeMo's ``lr_scheduler`` and on Lightning's strategies.

A schedule is called as NeMo's ``LRSchedulerModule`` is, ``schedule(module, optimizer)``, and returns what
Lightning's ``configure_optimizers`` returns; ``bionemo.lightning``'s step runners call it the same way on every
strategy. No NeMo import: it makes a plain ``torch.optim.lr_scheduler.LambdaLR``.
"""

import math
from typing import Any

from lightning.pytorch import Callback

__all__ = ["WarmupCosine"]


class WarmupCosine(Callback):
    """Linear warm-up from 0 to the learning rate over ``warmup_steps``, then cosine decay to ``min_ratio`` of it.

    The factor at step ``t`` (optimizer steps taken) is ``t / warmup_steps`` during warm-up and
    ``min_ratio + (1 - min_ratio) * (1 + cos(pi * p)) / 2`` after it, ``p`` the share of the remaining
    ``max_steps - warmup_steps`` steps done (1 from ``max_steps`` on). Each parameter group's rate is its own
    ``lr`` times the factor times its ``lr_mult`` (megatron's parameter groups carry one, e.g. for a head's own
    learning rate; 1 where a group has none). A Lightning callback because NeMo's optimizer module adds its
    scheduler to the trainer's callbacks (it has no hooks of its own).

    Args:
        max_steps: Optimizer steps of the run.
        warmup_steps: Steps of linear warm-up (0: start at the full rate).
        min_ratio: The rate at the end, as a share of the peak.
    """

    def __init__(self, *, max_steps: int, warmup_steps: int = 0, min_ratio: float = 0.0) -> None:
        super().__init__()
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        if not 0 <= warmup_steps <= max_steps:
            raise ValueError(f"warmup_steps must lie in [0, max_steps={max_steps}], got {warmup_steps}")
        if not 0 <= min_ratio <= 1:
            raise ValueError(f"min_ratio must lie in [0, 1], got {min_ratio}")
        self.max_steps = max_steps
        self.warmup_steps = warmup_steps
        self.min_ratio = min_ratio

    def factor(self, step: int) -> float:
        """The share of the peak rate at ``step``."""
        if step < self.warmup_steps:
            return step / self.warmup_steps
        decay = max(1, self.max_steps - self.warmup_steps)
        done = min(1.0, (step - self.warmup_steps) / decay)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * done))

    def __call__(self, module: Any, optimizer: Any) -> dict[str, Any]:
        """``{"optimizer": optimizer, "lr_scheduler": {...}}`` with a per-step ``LambdaLR``."""
        from torch.optim.lr_scheduler import LambdaLR

        def group_factor(mult: float):
            return lambda step: self.factor(step) * mult

        lambdas = [group_factor(float(group.get("lr_mult", 1.0))) for group in optimizer.param_groups]
        scheduler = LambdaLR(optimizer, lambdas)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}
