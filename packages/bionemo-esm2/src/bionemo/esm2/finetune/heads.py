"""Prediction heads on top of the ESM-2 encoder, for sequence tasks and per-residue tasks.

Every head takes the same two inputs:

- ``hidden`` ``[b, s, h]``: the encoder's last hidden states, batch first, in token order ``<cls> residues <eos>``
  then padding (``<cls>`` at position 0);
- ``residue_mask`` ``[b, s]`` bool: True on the residues only (not ``<cls>``, ``<eos>`` or padding);
- ``sample_index`` ``[b]`` (optional): each sample's position in its dataset. Given, dropout masks are keyed by
  (seed, step, sample, element) (:class:`bionemo.layers.KeyedDropout`), so every parallel layout and micro-batch
  size draws the same masks; without it dropout draws from torch's random stream.

Sequence heads return ``[b, num_outputs]``; token heads ``[b, s, num_outputs]``, one row per position, of which
only the residues' rows mean anything (the loss and metrics read those).
"""

import torch
from torch import nn

from bionemo.esm2.finetune.head_config import HeadConfig, HeadKind
from bionemo.layers.keyed_dropout import KeyedDropout

__all__ = ["ConvTokenHead", "HFSequenceHead", "HFTokenHead", "MeanPoolMLPHead", "build_head"]


class HFSequenceHead(nn.Module):
    """Hugging Face's ``EsmClassificationHead``: ``<cls>`` vector -> dropout -> dense -> tanh -> dropout -> out_proj.

    ``dense`` and ``out_proj`` map 1:1 onto ``classifier.dense`` / ``classifier.out_proj`` of
    ``EsmForSequenceClassification`` (same names and shapes), so the model exports to transformers unchanged.
    """

    def __init__(self, hidden_size: int, num_outputs: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.dropout = KeyedDropout(dropout)
        self.out_proj = nn.Linear(hidden_size, num_outputs)

    def forward(
        self, hidden: torch.Tensor, residue_mask: torch.Tensor | None = None, sample_index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``hidden`` ``[b, s, h]`` -> ``[b, num_outputs]`` from the ``<cls>`` position (the mask is not needed)."""
        x = self.dropout(hidden[:, 0, :], sample_index)
        x = torch.tanh(self.dense(x))
        return self.out_proj(self.dropout(x, sample_index, salt=1))


class HFTokenHead(nn.Module):
    """Hugging Face's ``EsmForTokenClassification`` head: dropout -> linear ``classifier`` at every position.

    ``classifier`` maps 1:1 onto ``EsmForTokenClassification.classifier``.
    """

    def __init__(self, hidden_size: int, num_outputs: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.dropout = KeyedDropout(dropout)
        self.classifier = nn.Linear(hidden_size, num_outputs)

    def forward(
        self, hidden: torch.Tensor, residue_mask: torch.Tensor | None = None, sample_index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``hidden`` ``[b, s, h]`` -> ``[b, s, num_outputs]`` (every position; the mask is not needed)."""
        return self.classifier(self.dropout(hidden, sample_index))


class MeanPoolMLPHead(nn.Module):
    """Mean of the residues' hidden states -> linear -> ReLU -> dropout -> linear (bionemo-esm2's sequence head).

    The mean covers the residues only (``residue_mask``), so ``<cls>``, ``<eos>`` and padding do not change it.
    """

    def __init__(self, hidden_size: int, num_outputs: int, mlp_hidden_size: int = 256, dropout: float = 0.25) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, mlp_hidden_size)
        self.dropout = KeyedDropout(dropout)
        self.out_proj = nn.Linear(mlp_hidden_size, num_outputs)

    def forward(
        self, hidden: torch.Tensor, residue_mask: torch.Tensor, sample_index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``hidden`` ``[b, s, h]``, ``residue_mask`` ``[b, s]`` -> ``[b, num_outputs]``.

        A sequence without residues pools to zeros (no division by zero).
        """
        weights = residue_mask.to(hidden.dtype).unsqueeze(-1)  # [b, s, 1]
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)
        return self.out_proj(self.dropout(torch.relu(self.dense(pooled)), sample_index))


class ConvTokenHead(nn.Module):
    """A 1-D convolution over the residues -> ReLU -> dropout -> linear at every position (per-residue tasks).

    Positions outside ``residue_mask`` (``<cls>``, ``<eos>``, padding) are zeroed before the convolution, so a
    residue's output depends on residues only, the same for any padding length: the convolution sees the
    sequence as if zero-padded at its ends.
    """

    def __init__(
        self, hidden_size: int, num_outputs: int, channels: int = 32, kernel_size: int = 7, dropout: float = 0.25
    ) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd (a centred window), got {kernel_size}")
        self.conv = nn.Conv1d(hidden_size, channels, kernel_size, padding=kernel_size // 2)
        self.dropout = KeyedDropout(dropout)
        self.classifier = nn.Linear(channels, num_outputs)

    def forward(
        self, hidden: torch.Tensor, residue_mask: torch.Tensor, sample_index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``hidden`` ``[b, s, h]``, ``residue_mask`` ``[b, s]`` -> ``[b, s, num_outputs]``."""
        x = hidden * residue_mask.to(hidden.dtype).unsqueeze(-1)
        x = self.conv(x.transpose(1, 2)).transpose(1, 2)  # [b, s, channels]
        return self.classifier(self.dropout(torch.relu(x), sample_index))


def build_head(config: HeadConfig, hidden_size: int, num_outputs: int) -> nn.Module:
    """The head ``config`` describes, for an encoder of width ``hidden_size`` and ``num_outputs`` outputs."""
    dropout = config.dropout if config.dropout is not None else 0.0  # HeadConfig fills it in
    if config.kind is HeadKind.HF_SEQUENCE:
        return HFSequenceHead(hidden_size, num_outputs, dropout)
    if config.kind is HeadKind.HF_TOKEN:
        return HFTokenHead(hidden_size, num_outputs, dropout)
    assert config.hidden_size is not None  # HeadConfig fills it in for these kinds
    if config.kind is HeadKind.MEAN_MLP:
        return MeanPoolMLPHead(hidden_size, num_outputs, config.hidden_size, dropout)
    assert config.kernel_size is not None
    return ConvTokenHead(hidden_size, num_outputs, config.hidden_size, config.kernel_size, dropout)
