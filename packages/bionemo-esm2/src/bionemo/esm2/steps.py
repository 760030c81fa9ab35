"""Forward steps of the ESM-2 recipes: training / validation and prediction (``ForwardStep`` contracts)."""

from typing import Any

import torch

from bionemo.esm2.model import vocab_logits
from bionemo.losses import ParallelGroups, token_cross_entropy

__all__ = ["forward_step", "make_predict_step"]


def forward_step(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Training / validation: ``{"token_logits": [s, b, v_local]}`` of the masked ``tokens``."""
    return {"token_logits": model(batch["tokens"], batch.get("padding"))}


def make_predict_step(*, embeddings: bool, logits: bool, perplexity: bool, vocab_size: int = 33):
    """The prediction forward step over :class:`bionemo.esm2.data.PredictionDataset` batches.

    Outputs for ``b`` sequences (only those asked for):

    - ``embeddings [b, h]`` float32: mean over residue positions (no ``<cls>``, ``<eos>`` or padding) of the
      last layer after the final LayerNorm, computed from the unmasked sequence.
    - ``logits [b, s, vocab_size]`` float32: raw scores of the unmasked sequence, position 0 = ``<cls>``,
      zeros at padding positions.
    - ``loss_sum [b]`` and ``num_masked [b]``: cross-entropy summed over the masked positions of
      ``masked_tokens`` and their count (masked-token perplexity = exp(sum / count)).
    """

    def predict_step(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        padding = batch.get("padding")
        if embeddings or logits:
            token_logits, hidden = model(batch["tokens"], padding, output_hidden=True)
            real = batch["attention_mask"]
            if embeddings:
                residues = real.clone()
                residues[:, 0] = False  # <cls>
                residues[torch.arange(len(real), device=real.device), real.sum(dim=1) - 1] = False  # <eos>
                weights = residues.unsqueeze(-1).float()
                out["embeddings"] = (hidden.transpose(0, 1).float() * weights).sum(dim=1) / weights.sum(dim=1).clamp(
                    min=1
                )
            if logits:
                full = vocab_logits(token_logits, vocab_size).transpose(0, 1).float()  # [b, s, v]
                out["logits"] = full * real.unsqueeze(-1)
        if perplexity:
            masked_logits = model(batch["masked_tokens"], padding)
            per_token = token_cross_entropy(masked_logits, batch["labels"], ParallelGroups.current().tensor)
            out["loss_sum"] = per_token.sum(dim=1)
            out["num_masked"] = (batch["labels"] >= 0).sum(dim=1)
        return out

    return predict_step
