"""Worker of the TokenWeightedSums gloo test (importable by spawned processes)."""

import torch
import torch.distributed as dist

from bionemo.losses import TokenWeightedSums


def loss_pairs(seed: int, n: int = 5) -> list[torch.Tensor]:
    """``n`` random ``[loss_sum, num_tokens]`` pairs; some count no token."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 40, (n,), generator=gen).float()
    return [torch.stack([torch.rand((), generator=gen) * 3 * c, c]) for c in counts]


def two_groups_worker(rank: int, world_size: int) -> dict[str, torch.Tensor | None]:
    """Rank 0 adds ``loss_pairs(7)``, the others nothing; reduced over the world, then a second all-rank group."""
    sums = TokenWeightedSums()
    if rank == 0:
        sums.add(loss_pairs(seed=7))
    other = dist.new_group(list(range(world_size)))
    return {"sums": sums.reduce(dist.group.WORLD, other, None), "mean": sums.mean(dist.group.WORLD)}
