"""Plain-PyTorch references computed from a trained model's weights."""

import torch
import torch.nn.functional as F


@torch.no_grad()
def reference_mean_loss(model: torch.nn.Module, dataset) -> float:
    """Token-weighted mean cross-entropy of ``model`` over every sample of ``dataset`` (plain torch)."""
    model.eval()
    total, count = 0.0, 0.0
    for i in range(len(dataset)):
        item = dataset[i]
        tokens = item["tokens"][None]
        logits = model(tokens, torch.arange(tokens.shape[1])[None], None)  # [1, s, v]
        per_token = F.cross_entropy(logits[0].float(), item["labels"], reduction="none")
        total += float((per_token * item["loss_mask"]).sum())
        count += float(item["loss_mask"].sum())
    return total / count


@torch.no_grad()
def reference_logits(model: torch.nn.Module, dataset) -> torch.Tensor:
    """``[s, n, v]`` logits of every sample of ``dataset``, in input order."""
    model.eval()
    outs = []
    for i in range(len(dataset)):
        tokens = dataset[i]["tokens"][None]
        outs.append(model(tokens, torch.arange(tokens.shape[1])[None], None).transpose(0, 1))
    return torch.cat(outs, dim=1)
