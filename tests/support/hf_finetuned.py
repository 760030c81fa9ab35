"""Small random fine-tuned ESM-2 models for the tests: Hugging Face classifiers, bionemo fine-tuned files, LoRA."""

from pathlib import Path

import torch

from support.hf_esm import padded_batch, random_hf_esm


def random_hf_classifier(
    base: Path,
    path: Path | None = None,
    *,
    token: bool = False,
    num_labels: int = 3,
    seed: int = 0,
    **config,
):
    """An ``EsmForSequenceClassification`` (``token``: ``EsmForTokenClassification``) on ``base``'s encoder.

    ``base`` (an ``EsmForMaskedLM`` folder) is made with :func:`support.hf_esm.random_hf_esm` when missing; the
    head is random at the scale of the encoder's weights (so logits differ clearly). ``config``: further
    ``EsmConfig`` settings (``problem_type``, ``id2label``, ...). Saved to ``path`` if given.
    """
    from transformers import EsmForSequenceClassification, EsmForTokenClassification

    if not base.exists():
        random_hf_esm(base, hidden=32, heads=4, layers=2, ffn=48, seed=seed)
    cls = EsmForTokenClassification if token else EsmForSequenceClassification
    model = cls.from_pretrained(base, num_labels=num_labels, **config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, param in model.classifier.named_parameters():
            scale = param.shape[-1] ** -0.5 if param.dim() > 1 else 0.3
            param.copy_(scale * torch.randn(param.shape, generator=generator))
    if path is not None:
        model.save_pretrained(path)
    return model


def hf_logits(model, sequences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``model``'s logits for one padded batch of ``sequences`` and the batch's attention mask ``[b, s]``."""
    ids, mask = padded_batch(sequences)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask.long()).logits, mask


def interleaved_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows ``[3h, ...]`` in megatron's ``linear_qkv`` order (per head: its q rows, k rows, v rows) from q, k, v."""
    h = q.shape[0]
    parts = [x.reshape(heads, h // heads, *x.shape[1:]) for x in (q, k, v)]
    return torch.stack(parts, dim=1).reshape(3 * h, *q.shape[1:])
