"""ESM-2 contact prediction: a logistic regression over the attention maps of every layer and head.

The maths of transformers' ``EsmForMaskedLM.predict_contacts`` (``EsmContactPredictionHead``, fair-esm's
``ContactPredictionHead``): each attention map is zeroed at padding and ``<eos>`` (queries and keys), cut to the
residues (no ``<cls>``, no last position), symmetrized (``A + A^T``) and average-product corrected
(``A - rowsum * colsum / total``); the regression weighs the ``num_layers * num_attention_heads`` corrected maps
of each residue pair, adds its bias and takes the sigmoid.

Here the weighted sum is accumulated layer by layer as :class:`bionemo.esm2.model.esm2.ESM2Model` hands out the
attention probabilities (``attention_maps``), so the maps of all layers are never held at once, and in a
factored form that reads each map three times instead of building the symmetrized and corrected copies. With
``A_c = M * P_c`` (``P_c`` a head's map cut to the residues, ``M = m m^T`` the mask of kept positions),
``sym_c = A_c + A_c^T``, its row sums ``r_c = rows(A_c) + cols(A_c)`` and total ``t_c = sum(r_c)``:

    sum_c w_c (sym_c - r_c r_c^T / t_c) = M * (W + W^T) - sum_c (w_c / t_c) r_c r_c^T,  W = sum_c w_c P_c

where ``rows(A_c)_i = m_i (P_c m)_i`` and ``cols(A_c)_j = m_j (m^T P_c)_j``: one weighted sum and two
matrix-vector products per map, and a rank-``c`` update. The head's
tensors (``bionemo.esm2.hf.layout.CONTACT_HEAD``) live in the checkpoint beside the model's; the megatron model
does not hold them, so a checkpoint without them (a trained bionemo model) loads for everything else.
"""

from collections.abc import Mapping
from typing import Any

import torch

from bionemo.esm2.hf.layout import CONTACT_HEAD

__all__ = ["EOS_TOKEN_ID", "ContactHead", "ContactLogits", "flat_contacts"]

EOS_TOKEN_ID = 2
"""``<eos>``'s id in ESM-2's vocabulary: its attention rows and columns are zeroed before the regression."""


class ContactHead:
    """The contact regression: ``weight [num_layers * num_attention_heads]`` (layer-major) and a scalar ``bias``.

    Args:
        weight: ``[1, layers * heads]`` or flat, as ``EsmContactPredictionHead.regression.weight``.
        bias: ``[1]``.
        num_heads: Attention heads per layer (of the whole model).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, num_heads: int) -> None:
        self.weight = weight.detach().reshape(-1).float()
        self.bias = bias.detach().reshape(()).float()
        self.num_heads = num_heads

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor], model: Mapping[str, Any]) -> "ContactHead":
        """The head of a checkpoint's whole tensors (:data:`~bionemo.esm2.hf.layout.CONTACT_HEAD` names).

        Raises:
            ValueError: ``tensors`` hold no contact head.
        """
        missing = [name for name in CONTACT_HEAD if name not in tensors]
        if missing:
            raise ValueError(f"the checkpoint has no contact head (no {missing[0]})")
        weight, bias = (tensors[name] for name in CONTACT_HEAD)
        return cls(weight, bias, int(model["num_attention_heads"]))

    def logits(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None) -> "ContactLogits":
        """An accumulator for one batch ``tokens [b, s]`` (``attention_mask`` True on real tokens, or None)."""
        return ContactLogits(self, tokens, attention_mask)


class ContactLogits:
    """The regression's sum for one batch, fed one run of heads at a time (a ``bionemo.esm2.model.esm2.AttentionMaps``).

    Give it as ``attention_maps`` to the model's forward, then read :meth:`probabilities`. The sum is over the
    heads it was given: under tensor parallelism a rank sees only its own heads (not summed across ranks here).
    """

    def __init__(self, head: ContactHead, tokens: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        keep = tokens.ne(EOS_TOKEN_ID)
        if attention_mask is not None:
            keep = keep & attention_mask.bool()
        self.head = head
        # no <cls>, no last position (an <eos> or padding); <eos> and padding inside are masked
        self.keep = keep[:, 1:-1].float()  # [b, S]
        b, s = tokens.shape
        self.weighted = torch.zeros(b, s - 2, s - 2, dtype=torch.float32, device=tokens.device)  # W
        self.correction = torch.zeros_like(self.weighted)  # sum_c (w_c / t_c) r_c r_c^T
        self.weight = head.weight.to(tokens.device)

    def __call__(self, layer: int, first_head: int, probabilities: torch.Tensor) -> None:
        """Add heads ``first_head ..`` of ``layer`` (``probabilities [b, heads, s, s]``; see the module docstring)."""
        maps = probabilities[..., 1:-1, 1:-1].float()  # [b, c, S, S]
        start = layer * self.head.num_heads + first_head
        weight = self.weight[start : start + maps.shape[1]]
        self.weighted += torch.einsum("bcij,c->bij", maps, weight)
        keep = self.keep[:, None]  # [b, 1, S]
        rows = torch.matmul(maps, keep[..., None])[..., 0] * keep  # rows(A_c) [b, c, S]
        columns = torch.matmul(keep[..., None, :], maps)[..., 0, :] * keep  # cols(A_c)
        sums = rows + columns  # r_c
        scaled = sums * (weight[:, None] / sums.sum(-1, keepdim=True))  # (w_c / t_c) r_c
        self.correction += torch.matmul(scaled.transpose(1, 2), sums)

    def probabilities(self) -> torch.Tensor:
        """``[b, s - 2, s - 2]`` contact probabilities of residue pairs (float32; rows past a sequence: padding)."""
        mask = self.keep[:, :, None] * self.keep[:, None, :]
        logits = mask * (self.weighted + self.weighted.transpose(1, 2)) - self.correction
        return torch.sigmoid(logits + self.head.bias.to(logits.device))


def flat_contacts(probabilities: torch.Tensor, residues: torch.Tensor) -> torch.Tensor:
    """``[b, max L_i^2]``: row ``i`` holds sequence ``i``'s ``[L_i, L_i]`` contacts row-major, then zeros.

    Args:
        probabilities: ``[b, S, S]`` with ``S`` at least every ``L_i`` (:meth:`ContactLogits.probabilities`).
        residues: ``[b]`` residues per sequence ``L_i`` (on any device; a host tensor needs no sync).

    One row per sequence whatever its batch's padding, so prediction shards of batches of other lengths join
    (right-padded) and each row's first ``L_i^2`` values are its contacts.
    """
    b, size = probabilities.shape[0], probabilities.shape[-1]
    device = probabilities.device
    lengths = residues.to(device, non_blocking=True).long()[:, None]  # [b, 1]
    positions = torch.arange(size * size, device=device)[None]  # [1, S^2]
    rows, columns = positions // lengths.clamp(min=1), positions % lengths.clamp(min=1)
    inside = positions < lengths * lengths
    picked = probabilities[torch.arange(b, device=device)[:, None], rows.clamp(max=size - 1), columns]
    return picked * inside
