"""What megatron's DistributedDataParallel does to trained parameters, for layer tests without a real DDP."""

import torch

__all__ = ["ddp_hook", "give_main_grad"]


def ddp_hook(weight: torch.nn.Parameter) -> None:
    """What megatron DDP's backward hook does with a parameter's gradient (its buffer is ``main_grad``)."""
    if weight.grad is not None and not weight.grad_added_to_main_grad:  # type: ignore[attr-defined]
        weight.main_grad.add_(weight.grad)  # type: ignore[attr-defined]
    weight.grad = None


def give_main_grad(layer: torch.nn.Module) -> None:
    """Attach what megatron's DDP gives every trained parameter: an fp32 ``main_grad`` and the fused-add flag."""
    for param in layer.parameters():
        param.main_grad = torch.zeros_like(param, dtype=torch.float32)  # type: ignore[attr-defined]
        param.grad_added_to_main_grad = False  # type: ignore[attr-defined]
