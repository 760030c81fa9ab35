"""Per-token cross-entropy for sequence-first logits, including vocab-parallel logits under tensor parallelism.

Unlike megatron's ``vocab_parallel_cross_entropy`` (which subtracts the max from fp32 logits in place),
nothing here writes into its inputs.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["token_cross_entropy"]


def token_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, tensor_group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Unreduced cross-entropy of every token, computed in fp32.

    Args:
        logits: ``[s, b, v_local]`` logits; under tensor parallelism each rank holds the contiguous vocab
            slice ``[rank * v_local, (rank + 1) * v_local)``.
        labels: ``[b, s]`` target ids in the full vocabulary. Negative ids (e.g. the ``-100`` padding) give a
            loss of 0.
        tensor_group: The tensor-parallel group the vocabulary is split over; ``None`` or a group of one
            means ``logits`` hold the whole vocabulary.

    Returns:
        ``[b, s]`` fp32 loss per token, differentiable with respect to ``logits``.
    """
    if logits.dim() != 3 or labels.dim() != 2 or logits.shape[:2] != labels.t().shape:
        raise ValueError(
            f"Expected token_logits [s, b, v] and labels [b, s]; got token_logits {tuple(logits.shape)} "
            f"and labels {tuple(labels.shape)}"
        )
    target = labels.t()  # [s, b], a view
    valid = target >= 0
    safe_target = torch.where(valid, target, torch.zeros_like(target))
    if tensor_group is None or dist.get_world_size(tensor_group) == 1:
        loss = F.cross_entropy(logits.float().flatten(0, 1), safe_target.flatten(), reduction="none").view_as(target)
    else:
        loss = _vocab_parallel_cross_entropy(logits, safe_target, tensor_group)
    return torch.where(valid, loss, torch.zeros_like(loss)).t()


def _vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``[s, b]`` loss from vocab-sharded ``[s, b, v_local]`` logits; identical on every rank of ``group``."""
    vocab_local = logits.shape[-1]
    start = dist.get_rank(group) * vocab_local
    x = logits.float()
    global_max = x.detach().amax(dim=-1, keepdim=True)
    dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
    shifted = x - global_max
    sum_exp = _SumOverGroup.apply(shifted.exp().sum(dim=-1), group)
    local_target = target - start
    in_slice = (local_target >= 0) & (local_target < vocab_local)
    picked = shifted.gather(-1, local_target.clamp(0, vocab_local - 1).unsqueeze(-1)).squeeze(-1)
    picked = _SumOverGroup.apply(picked * in_slice, group)
    return sum_exp.log() - picked


class _SumOverGroup(torch.autograd.Function):
    """All-reduce (sum) in forward, identity in backward.

    Each rank's slice contributes to the sum, and the loss built from it is replicated on every rank, so
    the gradient with respect to the local contribution is the incoming gradient unchanged.
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # type: ignore[override]
        out = tensor.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad, None
