"""Megatron loss reductions: a pass-through one for prediction and a masked-token one for language models."""

# First: lets megatron-core import on machines with nvcc but no GPU, before any submodule imports it.
from bionemo.losses import _nemo  # noqa: F401  # isort: skip


from bionemo.losses.cross_entropy import token_cross_entropy
from bionemo.losses.masked_token import LOSS_SUM_KEY, MaskedTokenLossReduction, masked_token_loss_sums
from bionemo.losses.parallel import ParallelGroups, all_reduce_sum
from bionemo.losses.passthrough import PassthroughLossReduction

__all__ = [
    "LOSS_SUM_KEY",
    "MaskedTokenLossReduction",
    "ParallelGroups",
    "PassthroughLossReduction",
    "all_reduce_sum",
    "masked_token_loss_sums",
    "token_cross_entropy",
]
