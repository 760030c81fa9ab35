"""Masked-language-model datasets and batching for protein sequences."""

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from bionemo.cli.esm2.readers import SequenceRecord
from bionemo.cli.esm2.tokenizer import ProteinTokenizer

__all__ = ["MaskedProteinDataset", "collate_proteins", "data_step"]


class MaskedProteinDataset(Dataset):
    """BERT-style masked sequences: 15% of residues chosen; of those 80% ``<mask>``, 10% random, 10% kept.

    With ``length`` larger than the number of records, item ``k`` is record ``k % n`` with masking drawn for
    ``k``: passes over the data see fresh masks (training). The masking of item ``k`` depends only on
    ``(seed, k)``, so every rank and every resumed run sees the same inputs. Each item: ``tokens``,
    ``labels`` (-100 where not chosen), ``loss_mask`` and ``sample_index`` (the record's position).
    """

    def __init__(
        self,
        records: Sequence[SequenceRecord],
        tokenizer: ProteinTokenizer,
        mask_prob: float = 0.15,
        seed: int = 0,
        length: int | None = None,
    ) -> None:
        self.records = list(records)
        self.tokenizer = tokenizer
        self.mask_prob = mask_prob
        self.seed = seed
        self.length = len(self.records) if length is None else length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        tok = self.tokenizer
        index = item % len(self.records)
        ids = tok.encode(self.records[index].sequence)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + item)
        residue = torch.zeros_like(ids, dtype=torch.bool)
        residue[1:-1] = True
        chosen = (torch.rand(ids.shape, generator=gen) < self.mask_prob) & residue
        if not chosen.any():  # every sequence contributes at least one prediction
            chosen[1 + int(torch.randint(len(ids) - 2, (1,), generator=gen))] = True
        action = torch.rand(ids.shape, generator=gen)
        random_residues = tok.residue_ids[torch.randint(len(tok.residue_ids), ids.shape, generator=gen)]
        tokens = torch.where(chosen & (action < 0.8), torch.full_like(ids, tok.mask_id), ids)
        tokens = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_residues, tokens)
        return {
            "tokens": tokens,
            "labels": torch.where(chosen, ids, torch.full_like(ids, -100)),
            "loss_mask": chosen.float(),
            "sample_index": torch.tensor(index),
        }


def collate_proteins(items: list[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of items into ``[b, s]`` tensors plus an ``attention_mask`` (True on real tokens)."""
    length = max(item["tokens"].shape[0] for item in items)
    batch: dict[str, torch.Tensor] = {
        "tokens": torch.full((len(items), length), pad_id, dtype=torch.long),
        "labels": torch.full((len(items), length), -100, dtype=torch.long),
        "loss_mask": torch.zeros(len(items), length),
        "attention_mask": torch.zeros(len(items), length, dtype=torch.bool),
        "sample_index": torch.stack([item["sample_index"] for item in items]),
    }
    for row, item in enumerate(items):
        n = item["tokens"].shape[0]
        batch["tokens"][row, :n] = item["tokens"]
        batch["labels"][row, :n] = item["labels"]
        batch["loss_mask"][row, :n] = item["loss_mask"]
        batch["attention_mask"][row, :n] = True
    return batch


def data_step(dataloader_iter: Iterator[dict[str, torch.Tensor]]) -> dict[str, Any]:
    """Move one micro-batch to the compute device and add megatron's padding mask (True = masked out).

    The mask is None when no sequence in the micro-batch is padded (checked on the host, before the copy):
    torch's flash attention kernel takes no mask, so full-length batches run on it.
    """
    batch = next(dataloader_iter)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    padded = not bool(batch["attention_mask"].all())
    moved: dict[str, Any] = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
    moved["padding_mask"] = ~moved["attention_mask"][:, None, None, :] if padded else None
    return moved
