"""Megatron loss reductions: a pass-through one for prediction and a masked-token one for language models.

Plain torch: importing this package loads neither NeMo nor Lightning nor megatron-core (megatron's parallel
state is read lazily, when a process group exists).
"""

from bionemo.losses.cross_entropy import token_cross_entropy
from bionemo.losses.masked_token import LOSS_SUM_KEY, MaskedTokenLossReduction, masked_token_loss_sums
from bionemo.losses.parallel import ParallelGroups, all_reduce_sum
from bionemo.losses.passthrough import PassthroughLossReduction
from bionemo.losses.reduction import LossReduction
from bionemo.losses.token_sums import TokenWeightedSums

__all__ = [
    "LOSS_SUM_KEY",
    "LossReduction",
    "MaskedTokenLossReduction",
    "ParallelGroups",
    "PassthroughLossReduction",
    "TokenWeightedSums",
    "all_reduce_sum",
    "masked_token_loss_sums",
    "token_cross_entropy",
]
