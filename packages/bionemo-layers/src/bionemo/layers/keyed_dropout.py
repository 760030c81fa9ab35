"""Dropout whose mask is a function of (seed, step, sample, element): the same masks on every parallel layout.

``torch.nn.Dropout`` draws its mask from the process's random stream, so the masks a sample gets depend on which
rank holds it and on how many micro-batches that rank ran before: one process, DDP x2 or a different micro-batch
size train different models from the same settings. :class:`KeyedDropout` instead hashes each element's
coordinates: ``seed``, the optimizer ``step`` (set by the training loop, :func:`set_dropout_step`), the sample's
``sample_index`` (its position in the dataset) and the element's flat position within the sample. A counter-based
generator (SplitMix64's finaliser, on int64 tensors) turns those into independent uniform numbers, so the mask
of a sample at a step is the same wherever the sample is computed, and differs from step to step.
"""

import torch
from torch import nn

__all__ = ["KeyedDropout", "keyed_dropout", "keyed_uniform", "set_dropout_step"]

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed 64-bit integer
_MIX_1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX_2 = -7723592293110705685  # 0x94D049BB133111EB


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 ``z`` (torch's ``>>`` is arithmetic on negative values)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser: a bijection of int64 whose outputs look independent for consecutive inputs."""
    z = (z ^ _shift_right(z, 30)) * _MIX_1
    z = (z ^ _shift_right(z, 27)) * _MIX_2
    return z ^ _shift_right(z, 31)


def keyed_uniform(
    shape: torch.Size, seed: int, step: int, sample_index: torch.Tensor, *, salt: int = 0
) -> torch.Tensor:
    """Uniform numbers in ``[0, 1)`` of ``shape`` (``[b, ...]``), element ``[i, ...]`` keyed by ``sample_index[i]``.

    Args:
        shape: ``[b, ...]``: ``b`` samples; the rest is each sample's elements, numbered in row-major order.
        seed: The run's seed.
        step: The optimizer step.
        sample_index: ``[b]`` integers, each sample's identity (its dataset position); on the result's device.
        salt: Tells apart the draws of one sample at one step (two dropouts in one layer, say).

    Returns:
        float32 ``shape`` on ``sample_index``'s device; element ``j`` of a sample depends on (seed, step,
        sample, salt, j) only, not on ``b``, the other samples or the trailing sizes beyond ``j``'s position.
    """
    device = sample_index.device

    def key(value: int) -> torch.Tensor:  # int64 tensor arithmetic wraps around; Python ints would not fit
        # A fill kernel, not torch.tensor: copying a host scalar to a GPU makes the host wait for the device.
        return torch.full((), value, dtype=torch.int64, device=device)

    base = _mix(_mix(key(seed) * _GOLDEN + step) + key(salt) * _GOLDEN)
    keys = _mix(base ^ (sample_index.to(torch.int64) * _GOLDEN))  # [b]
    per_sample = int(torch.Size(shape[1:]).numel())
    position = torch.arange(per_sample, dtype=torch.int64, device=device)
    z = _mix(keys[:, None] + (position[None, :] + 1) * _GOLDEN)  # [b, elements]
    return (_shift_right(z, 40).to(torch.float32) * 2.0**-24).view(shape)


def keyed_dropout(
    x: torch.Tensor, p: float, seed: int, step: int, sample_index: torch.Tensor, *, salt: int = 0
) -> torch.Tensor:
    """``x [b, ...]`` with each element zeroed with probability ``p`` (keyed masks), the rest scaled by 1/(1-p)."""
    keep = keyed_uniform(x.shape, seed, step, sample_index.to(x.device), salt=salt) >= p
    return x * keep.to(x.dtype) * (1.0 / (1.0 - p))


class KeyedDropout(nn.Module):
    """``nn.Dropout`` with masks keyed by (seed, step, sample, element) when given each sample's ``sample_index``.

    Args:
        p: Probability of zeroing an element, in ``[0, 1)``.
        seed: The run's seed (part of every key).

    ``step`` (an attribute, 0 at first) is the optimizer step the masks are drawn for; the training loop sets it
    before each step (:func:`set_dropout_step`). Without ``sample_index`` the module is ``nn.Dropout``; in eval
    mode, or at ``p == 0``, it returns its input.

    Raises:
        ValueError: ``p`` outside ``[0, 1)``.
    """

    def __init__(self, p: float, *, seed: int = 0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p={p!r}: valid is a number in [0, 1)")
        self.p = p
        self.seed = seed
        self.step = 0

    def forward(self, x: torch.Tensor, sample_index: torch.Tensor | None = None, *, salt: int = 0) -> torch.Tensor:
        """``x [b, ...]``, ``sample_index [b]`` -> ``x`` with dropout applied (training only).

        ``salt`` tells apart two uses of this module on one sample in one step (a different mask each).
        """
        if not self.training or self.p == 0.0:
            return x
        if sample_index is None:
            return nn.functional.dropout(x, self.p, training=True)
        return keyed_dropout(x, self.p, self.seed, self.step, sample_index, salt=salt)

    def extra_repr(self) -> str:
        """``p`` and ``seed``, as ``print(model)`` shows them."""
        return f"p={self.p}, seed={self.seed}"


def set_dropout_step(module: nn.Module, step: int, *, seed: int | None = None) -> None:
    """Set the step (and ``seed``, if given) of every :class:`KeyedDropout` in ``module``, before each step."""
    for child in module.modules():
        if isinstance(child, KeyedDropout):
            child.step = step
            if seed is not None:
                child.seed = seed
