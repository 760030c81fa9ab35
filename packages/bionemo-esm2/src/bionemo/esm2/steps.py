"""Forward steps of the ESM-2 recipes: training / validation and prediction (``ForwardStep`` contracts)."""

from collections.abc import Sequence
from typing import Any

import torch

from bionemo.esm2.model import vocab_logits
from bionemo.losses import ParallelGroups, token_cross_entropy

__all__ = ["forward_step", "make_predict_step"]


def forward_step(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Training / validation: ``{"token_logits": [s, b, v_local]}`` of the masked ``tokens``."""
    return {"token_logits": model(batch["tokens"], batch.get("padding"))}


def make_predict_step(
    *,
    embeddings: bool,
    logits: bool,
    perplexity: bool,
    residues: bool = False,
    cls: bool = False,
    pseudo_perplexity: bool = False,
    mask_id: int = 32,
    layers: Sequence[int] = (),
    num_layers: int | None = None,
    vocab_size: int = 33,
):
    """The prediction forward step over :class:`bionemo.esm2.data.PredictionDataset` batches.

    Outputs for ``b`` sequences (only those asked for), all from the unmasked sequence unless said otherwise:

    - ``embeddings [b, h]`` float32: mean over residue positions (no ``<cls>``, ``<eos>`` or padding) of the
      last layer after the final LayerNorm; ``embeddings.layer{K} [b, h]`` the same for each of ``layers``
      (absolute: 0 = the embedding output, ``num_layers`` = after the final LayerNorm).
    - ``residue_embeddings [b, s - 2, h]`` (residues only, zeros beyond each sequence's length; the last layer)
      and ``residue_embeddings.layer{K}`` for each of ``layers``.
    - ``cls [b, h]``: the last layer's ``<cls>`` vector.
    - ``logits [b, s, vocab_size]`` float32: raw scores, position 0 = ``<cls>``, zeros at padding positions.
    - ``loss_sum [b]`` and ``num_masked [b]``: cross-entropy summed over the masked positions of
      ``masked_tokens`` and their count (masked-token perplexity = exp(sum / count)).
    - ``pseudo_loss_sum [b]``: the exact pseudo-log-likelihood's negative: every residue masked once (one copy
      of the sequence per residue, run ``b`` copies at a time), the cross-entropy of the true residue summed
      (pseudo-perplexity = exp(sum / length)).
    """
    last = num_layers if num_layers is not None else -1
    wanted = [k for k in dict.fromkeys(layers) if k != last]

    def predict_step(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        padding = batch.get("padding")
        if embeddings or logits or residues or cls or wanted:
            if wanted:
                token_logits, hidden, extra = model(batch["tokens"], padding, hidden_layers=wanted)
            else:
                token_logits, hidden = model(batch["tokens"], padding, output_hidden=True)
                extra = {}
            real = batch["attention_mask"]
            residue_mask = real.clone()
            residue_mask[:, 0] = False  # <cls>
            residue_mask[torch.arange(len(real), device=real.device), real.sum(dim=1) - 1] = False  # <eos>
            weights = residue_mask.unsqueeze(-1).float()
            per_layer = {"": hidden, **{f".layer{k}": hidden if k == last else extra[k] for k in layers}}
            for suffix, states in per_layer.items():
                states = states.transpose(0, 1).float() * weights  # [b, s, h], zero outside residues
                if embeddings or suffix:
                    out["embeddings" + suffix] = states.sum(dim=1) / weights.sum(dim=1).clamp(min=1)
                if residues:
                    out["residue_embeddings" + suffix] = states[:, 1:-1]
            if cls:
                out["cls"] = hidden[0].float()
            if logits:
                full = vocab_logits(token_logits, vocab_size).transpose(0, 1).float()  # [b, s, v]
                out["logits"] = full * real.unsqueeze(-1)
        if pseudo_perplexity:
            out["pseudo_loss_sum"] = _pseudo_loss_sums(model, batch, mask_id)
        if perplexity:
            masked_logits = model(batch["masked_tokens"], padding)
            per_token = token_cross_entropy(masked_logits, batch["labels"], ParallelGroups.current().tensor)
            out["loss_sum"] = per_token.sum(dim=1)
            out["num_masked"] = (batch["labels"] >= 0).sum(dim=1)
        return out

    return predict_step


def _pseudo_loss_sums(model: Any, batch: dict[str, torch.Tensor], mask_id: int) -> torch.Tensor:
    """Per sequence, the summed cross-entropy of each residue predicted with only that residue masked."""
    tokens, real = batch["tokens"], batch["attention_mask"]
    b, s = tokens.shape
    lengths = real.sum(dim=1) - 2  # residues
    rows = torch.repeat_interleave(torch.arange(b, device=tokens.device), lengths)  # one copy per residue
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.arange(len(rows), device=tokens.device) - starts[rows] + 1  # 1..L of each sequence
    totals = torch.zeros(b, device=tokens.device, dtype=torch.float32)
    group = ParallelGroups.current().tensor
    for chunk in torch.arange(len(rows), device=tokens.device).split(max(1, b)):
        sequence, position = rows[chunk], positions[chunk]
        copies = tokens[sequence].clone()
        picked = torch.arange(len(chunk), device=tokens.device)
        labels = torch.full_like(copies, -100)
        labels[picked, position] = copies[picked, position]
        copies[picked, position] = mask_id
        mask = real[sequence]
        logits = model(copies, None if bool(mask.all()) else mask)
        loss = token_cross_entropy(logits, labels, group).sum(dim=1)  # [copies]
        totals.index_add_(0, sequence, loss.float())
    return totals
