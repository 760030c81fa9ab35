"""``--encoder frozen``: the encoder runs once per sequence, and the head trains on the cached hidden states.

With the encoder frozen its output for a sequence never changes, so recomputing it every pass is wasted work:
:class:`CachedFeaturesDataModule` encodes every training and validation sequence once (in its ``setup``, on the
trainer's device, in batches of about :data:`ENCODE_TOKENS` tokens) and keeps what the head reads on the host:

- sequence heads: one vector per sequence (``hf-sequence``: the ``<cls>`` vector; ``mean-mlp``: the mean over the
  residues), stored as a one-position "sequence" ``[1, h]`` with that position marked a residue, so each head runs
  unchanged on it;
- token heads: the whole ``[L + 2, h]`` (``<cls>``, residues, ``<eos>``).

The head then trains as an ordinary small model (:class:`CachedHeadConfig`) with the fine-tuning loss reduction,
on Lightning's own strategies (CPU, one GPU, DDP).
"""

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from bionemo.core import BionemoTrainableModelConfig
from bionemo.esm2.finetune.class_weights import ClassWeights
from bionemo.esm2.finetune.data import collate_flat, residue_mask
from bionemo.esm2.finetune.head_config import HeadKind
from bionemo.esm2.finetune.heads import build_head
from bionemo.esm2.finetune.label_scaling import LabelScaling
from bionemo.esm2.finetune.objectives import targets
from bionemo.esm2.finetune.reduction import FinetuneLossReduction, task_reduction
from bionemo.esm2.finetune.spec import FinetuneSpec
from bionemo.esm2.finetune.tasks import LabelledRecord, LabelVocabulary
from bionemo.lightning import MegatronDataModule

__all__ = [
    "ENCODE_TOKENS",
    "CachedFeatureDataset",
    "CachedFeaturesDataModule",
    "CachedHead",
    "CachedHeadConfig",
    "cached_forward_step",
    "collate_cached",
    "encode",
]

ENCODE_TOKENS = 16_384
"""Tokens (padding included) per batch when the frozen encoder runs over the sequences."""


def encode(
    encoder: nn.Module, records: Sequence[LabelledRecord], kind: HeadKind, device: torch.device
) -> list[torch.Tensor]:
    """What the head reads of each record (see the module docstring), on the CPU, in the encoder's dtype.

    ``encoder`` is an ``ESM2Model`` without LM head on ``device``; batches are length-sorted, so little is padded.
    """
    from bionemo.esm2.data.mlm import length_sorted_batches
    from bionemo.esm2.tokenizer import ProteinTokenizer

    tokenizer = ProteinTokenizer()
    ids = [tokenizer.encode(r.sequence) for r in records]
    batches = length_sorted_batches([len(i) for i in ids], tokens_per_batch=ENCODE_TOKENS, batch_size=None)
    features: list[torch.Tensor | None] = [None] * len(records)
    encoder.eval()
    with torch.no_grad():
        for batch in batches:
            longest = max(len(ids[i]) for i in batch)
            tokens = torch.full((len(batch), longest), tokenizer.pad_id, dtype=torch.long)
            real = torch.zeros(len(batch), longest, dtype=torch.bool)
            for row, i in enumerate(batch):
                tokens[row, : len(ids[i])], real[row, : len(ids[i])] = ids[i], True
            tokens, real = tokens.to(device), real.to(device)
            padded = bool((~real).any())
            _, hidden = encoder(tokens, real if padded else None, output_hidden=True, output_logits=False)
            hidden = hidden.transpose(0, 1)  # [b, s, h]
            mask = residue_mask(real)
            if kind is HeadKind.MEAN_MLP:
                weights = mask.to(hidden.dtype).unsqueeze(-1)
                kept = ((hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)).unsqueeze(1)
            elif kind is HeadKind.HF_SEQUENCE:
                kept = hidden[:, :1]
            else:
                kept = hidden
            for row, i in enumerate(batch):
                width = 1 if kind in (HeadKind.MEAN_MLP, HeadKind.HF_SEQUENCE) else len(ids[i])
                features[i] = kept[row, :width].to("cpu", copy=True)
    return [f for f in features if f is not None]


class CachedFeatureDataset(Dataset):
    """Cached encoder outputs with their targets, in :class:`~bionemo.esm2.finetune.data.LabelledDataset`'s order.

    Items: ``hidden [n, h]`` (float32), ``residue_mask [n]``, ``target``, ``target_mask`` (the labelled dataset's,
    or for sequence tasks as they are), ``sample_index``.
    """

    def __init__(
        self,
        features: Sequence[torch.Tensor],
        records: Sequence[LabelledRecord],
        vocabulary: LabelVocabulary,
        *,
        seed: int = 0,
        length: int | None = None,
    ) -> None:
        from bionemo.esm2.finetune.data import LabelledDataset

        self.features = list(features)
        self.order = LabelledDataset(records, vocabulary, seed=seed, length=length)
        self.records = list(records)
        self.vocabulary = vocabulary

    def __len__(self) -> int:
        return len(self.order)

    def record_index(self, item: int) -> int:
        """Which record item ``item`` is."""
        return self.order.record_index(item)

    def item_tokens(self, item: int) -> int:
        """Tokens of item ``item``'s sequence (residues + 2), what training throughput counts."""
        return self.order.item_tokens(item)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        return self.record_item(self.record_index(item))

    def record_item(self, index: int) -> dict[str, torch.Tensor]:
        """Record ``index``'s cached features and targets (see the class docstring)."""
        hidden = self.features[index].float()
        n = hidden.shape[0]
        if self.vocabulary.task.per_residue:
            target, mask = targets(self.vocabulary.task, [self.records[index]], self.vocabulary, seq_len=n)
            residues = residue_mask(torch.ones(1, n, dtype=torch.bool))[0]
        else:
            target, mask = targets(self.vocabulary.task, [self.records[index]], self.vocabulary)
            residues = torch.ones(1, dtype=torch.bool)
        return {
            "hidden": hidden,
            "residue_mask": residues,
            "target": target[0],
            "target_mask": mask[0],
            "sample_index": torch.tensor(index),
        }


def collate_cached(items: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """Right-pad cached items into ``hidden [b, n, h]`` (zeros) with their masks and targets (token tasks padded)."""
    lengths = [item["hidden"].shape[0] for item in items]
    n, b = max(lengths), len(items)
    hidden = items[0]["hidden"].new_zeros(b, n, items[0]["hidden"].shape[1])
    residues = torch.zeros(b, n, dtype=torch.bool)
    attention = torch.zeros(b, n, dtype=torch.bool)
    for row, (item, length) in enumerate(zip(items, lengths, strict=True)):
        hidden[row, :length], residues[row, :length], attention[row, :length] = (
            item["hidden"],
            item["residue_mask"],
            True,
        )
    batch: dict[str, Any] = {"hidden": hidden, "residue_mask": residues, "attention_mask": attention}
    if items[0]["target_mask"].dim() == 1:
        batch["target"] = items[0]["target"].new_zeros(b, n)
        batch["target_mask"] = torch.zeros(b, n, dtype=torch.bool)
        for row, (item, length) in enumerate(zip(items, lengths, strict=True)):
            batch["target"][row, :length], batch["target_mask"][row, :length] = item["target"], item["target_mask"]
    else:
        batch["target"] = torch.stack([item["target"] for item in items])
        batch["target_mask"] = torch.stack([item["target_mask"] for item in items])
    batch["sample_index"] = torch.stack([item["sample_index"] for item in items])
    batch["host_lengths"] = lengths
    return batch


class CachedFeaturesDataModule(MegatronDataModule):
    """Encodes the records once in ``setup`` (on the trainer's device), then serves the cached features.

    Args:
        encoder_factory: Builds the frozen encoder (an ``ESM2Model`` without LM head, base weights loaded) on a
            device, in the dtype it should run in.
        spec: The fine-tuning spec (the head's kind decides what is kept).
        train, val: The labelled records.
        length: Training items of the whole run (``max_steps x global batch``).
        token_batched: For batches cut by tokens, per mode (``train``, ``validation``) what turns the cached
            features' dataset into one of micro-batches (:func:`~bionemo.esm2.finetune.data.token_batched`);
            None: batches by count.
        seed: Seed of the training order.
        **kwargs: ``MegatronDataModule``'s batch sizes and loader options.
    """

    def __init__(
        self,
        *,
        encoder_factory: Any,
        spec: FinetuneSpec,
        train_records: Sequence[LabelledRecord],
        val_records: Sequence[LabelledRecord],
        length: int,
        seed: int,
        token_batched: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        collate = collate_cached if token_batched is None else functools.partial(collate_flat, collate_cached)
        super().__init__(collate_fn=collate, seed=seed, **kwargs)
        self.token_batched = token_batched
        self.encoder_factory = encoder_factory
        self.spec = spec
        self.records = {"train": list(train_records), "validation": list(val_records)}
        self.length = length
        self.encode_seconds: float | None = None

    def setup(self, stage: str) -> None:
        """Encode every record once (first call), then check the batch layout as ``MegatronDataModule`` does."""
        if self.datasets["train"] is None:
            import time

            device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
            started = time.perf_counter()
            encoder = self.encoder_factory(device)
            kind = self.spec.head.kind
            features = {mode: encode(encoder, records, kind, device) for mode, records in self.records.items()}
            del encoder
            self.encode_seconds = time.perf_counter() - started
            labels = self.spec.labels
            self.datasets["train"] = CachedFeatureDataset(
                features["train"], self.records["train"], labels, seed=self.seed, length=self.length
            )
            self.datasets["validation"] = CachedFeatureDataset(
                features["validation"], self.records["validation"], labels
            )
            if self.token_batched is not None:
                for mode, batched in self.token_batched.items():
                    self.datasets[mode] = batched(self.datasets[mode])
        super().setup(stage)


class CachedHead(nn.Module):
    """The head alone on cached hidden states: ``forward(hidden [b, n, h], residue_mask [b, n], sample_index)``."""

    def __init__(self, spec: FinetuneSpec, hidden_size: int, label_scaling: LabelScaling | None = None) -> None:
        super().__init__()
        self.head = build_head(spec.head, hidden_size, spec.num_outputs)
        self.label_scaling = label_scaling

    def forward(
        self, hidden: torch.Tensor, residue_mask: torch.Tensor, sample_index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The head's logits (:mod:`bionemo.esm2.finetune.heads`), in the labels' units with ``label_scaling``.

        ``sample_index`` keys the head's dropout masks.
        """
        logits = self.head(hidden, residue_mask, sample_index)
        return logits if self.label_scaling is None else self.label_scaling.apply(logits)


@dataclass(kw_only=True)
class CachedHeadConfig(BionemoTrainableModelConfig[CachedHead, FinetuneLossReduction]):
    """Builds :class:`CachedHead` and names the task's loss reduction (``BionemoLightningModule``'s config contract)."""

    spec: FinetuneSpec
    hidden_size: int
    label_scaling: LabelScaling | None = None
    """A regression run's label scaling (:mod:`bionemo.esm2.finetune.label_scaling`), or None."""
    class_weights: ClassWeights | None = None
    """A classification run's loss weights per class (:mod:`bionemo.esm2.finetune.class_weights`), or None."""

    def configure_model(self, *args: Any, **kwargs: Any) -> CachedHead:
        """A freshly initialised head."""
        return CachedHead(self.spec, self.hidden_size, self.label_scaling)

    def get_loss_reduction_class(self) -> Any:  # a factory called as the class is
        """The task's loss reduction (:func:`~bionemo.esm2.finetune.reduction.task_reduction`)."""
        return task_reduction(self.spec.task, self.label_scaling, self.class_weights)


def cached_forward_step(model: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """``{"logits": head(hidden, residue_mask, sample_index)}`` of a cached batch."""
    return {"logits": model(batch["hidden"], batch["residue_mask"], batch.get("sample_index"))}
