"""Masked-language-model datasets and batching for protein sequences."""

import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from bionemo.core import compute_device
from bionemo.esm2.data.readers import SequenceRecord
from bionemo.esm2.tokenizer import ProteinTokenizer, encoded_length

__all__ = [
    "MaskedProteinDataset",
    "MaskedTokenBatches",
    "PredictionBatches",
    "PredictionDataset",
    "collate_proteins",
    "data_step",
    "training_data_step",
    "first_item",
    "length_sorted_batches",
    "mask_tokens",
    "spread_over_ranks",
]


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
        index = item % len(self.records)
        return _masked_item(self, index, self.seed * 1_000_003 + item)

    def item_lengths(self, item: int) -> list[int]:
        """Tokens of item ``item``'s sequence (residues + 2), as a one-element list."""
        return [encoded_length(self.records[item % len(self.records)].sequence)]


class MaskedTokenBatches(Dataset):
    """Training or validation micro-batches cut by tokens: item ``k`` is micro-batch ``k``'s masked sequences.

    ``batches`` is a :class:`~bionemo.esm2.data.token_batches.TokenBatches` over ``records``' token lengths.

    Serve it with ``micro_batch_size=1`` and ``collate_flat(collate_proteins)``; a global batch is ``batches.parts``
    items. Each sequence is masked as :class:`MaskedProteinDataset` masks it, with the mask drawn from ``seed``, the
    pass over the records and the record: a record gets fresh masks each pass, and the same ones on every layout and
    after a resume, whichever micro-batch it lands in.
    """

    def __init__(
        self,
        records: Sequence[SequenceRecord],
        tokenizer: ProteinTokenizer,
        batches: Any,
        mask_prob: float = 0.15,
        seed: int = 0,
    ) -> None:
        self.records = list(records)
        self.tokenizer = tokenizer
        self.batches = batches
        self.mask_prob = mask_prob
        self.seed = seed

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, item: int) -> list[dict[str, torch.Tensor]]:
        epoch = self.batches.pass_of(item // self.batches.parts)
        seed = self.seed * 1_000_003 + epoch
        return [
            _masked_item(self, index, (seed * 1_000_000_007 + index) % 2**64) for index in self.batches.records(item)
        ]

    def item_lengths(self, item: int) -> list[int]:
        """Tokens of each sequence of micro-batch ``item`` (residues + 2)."""
        return [encoded_length(self.records[index].sequence) for index in self.batches.records(item)]


def _masked_item(data: MaskedProteinDataset | MaskedTokenBatches, index: int, seed: int) -> dict[str, torch.Tensor]:
    """Record ``index`` of ``data`` masked with the generator seeded by ``seed``: a training item."""
    ids = data.tokenizer.encode(data.records[index].sequence)
    tokens, labels = mask_tokens(ids, data.tokenizer, data.mask_prob, torch.Generator().manual_seed(seed))
    return {"tokens": tokens, "labels": labels, "loss_mask": (labels >= 0).float(), "sample_index": torch.tensor(index)}


class PredictionDataset(Dataset):
    """Sequences to predict: the unmasked ``tokens`` and a masked copy for the masked-token perplexity estimate.

    Embeddings and logits come from ``tokens`` (the sequence as given). ``masked_tokens`` / ``labels`` are
    masked as in training (15% of residues), with the mask drawn from a seed computed from the sequence itself:
    the same sequence gets the same mask in any row, batch, run or number of devices. ``masked=False`` leaves
    them out (a third of the items' preparation time, for predictions without the perplexity estimate).
    """

    def __init__(
        self,
        records: Sequence[SequenceRecord],
        tokenizer: ProteinTokenizer,
        mask_prob: float = 0.15,
        *,
        masked: bool = True,
    ) -> None:
        self.records = list(records)
        self.tokenizer = tokenizer
        self.mask_prob = mask_prob
        self.masked = masked

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        sequence = self.records[item].sequence
        ids = self.tokenizer.encode(sequence)
        if not self.masked:
            return {"tokens": ids, "sample_index": torch.tensor(item)}
        gen = torch.Generator().manual_seed(zlib.crc32(sequence.upper().encode("ascii")))
        masked, labels = mask_tokens(ids, self.tokenizer, self.mask_prob, gen)
        return {"tokens": ids, "masked_tokens": masked, "labels": labels, "sample_index": torch.tensor(item)}


def length_sorted_batches(
    lengths: Sequence[int], *, tokens_per_batch: int | None = None, batch_size: int | None = None
) -> list[list[int]]:
    """Group sample positions into batches of similar length, longest first (little padding, OOM shows early).

    Samples are sorted by ``lengths`` (tokens, ``<cls>`` and ``<eos>`` included), longest first, ties in input
    order, and cut greedily: a batch takes the next sample while its padded size (samples x its longest)
    stays within ``tokens_per_batch`` and it holds fewer than ``batch_size`` samples. The plan depends only on
    the lengths and the limits.

    Raises:
        ValueError: Neither limit given, a limit below 1, or a sample longer than ``tokens_per_batch``.
    """
    if tokens_per_batch is None and batch_size is None:
        raise ValueError("give tokens_per_batch or batch_size")
    if (tokens_per_batch is not None and tokens_per_batch < 1) or (batch_size is not None and batch_size < 1):
        raise ValueError(f"tokens_per_batch={tokens_per_batch} and batch_size={batch_size} must be at least 1")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if order and tokens_per_batch is not None and lengths[order[0]] > tokens_per_batch:
        raise ValueError(
            f"tokens_per_batch={tokens_per_batch} is less than the longest sample's {lengths[order[0]]} tokens "
            f"(sample {order[0]}); give at least {lengths[order[0]]}"
        )
    batches: list[list[int]] = []
    for index in order:
        current = batches[-1] if batches else None
        fits = current is not None and (batch_size is None or len(current) < batch_size)
        if fits and tokens_per_batch is not None:
            fits = (len(current) + 1) * lengths[current[0]] <= tokens_per_batch  # type: ignore[index]
        if fits:
            current.append(index)  # type: ignore[union-attr]
        else:
            batches.append([index])
    return batches


def spread_over_ranks(batches: Sequence[Sequence[int]], ranks: int) -> list[list[int]]:
    """``batches`` with at least one batch for each of ``ranks`` data-parallel ranks, which are dealt them in turn.

    While there are fewer batches than ranks, the batch with the most samples (the earliest of those) is cut in
    two halves in its place, so that no rank idles while another predicts everything; the halves stay within the
    limits the batch kept. With fewer samples than ranks, empty batches make up the count: those ranks predict
    nothing (Lightning's distributed sampler refuses to leave a rank without a batch).
    """
    out = [list(batch) for batch in batches]
    while 0 < len(out) < ranks:
        widest = max(range(len(out)), key=lambda k: (len(out[k]), -k))
        batch = out[widest]
        if len(batch) < 2:
            break
        half = (len(batch) + 1) // 2
        out[widest : widest + 1] = [batch[:half], batch[half:]]
    return out + [[] for _ in range(ranks - len(out))]


class PredictionBatches(Dataset):
    """Whole prediction batches as items: item ``k`` is the collated batch of samples ``batches[k]``.

    Serve it with one item per micro-batch (``micro_batch_size=1`` and :func:`first_item` as collate): the
    samplers of Lightning and megatron then deal batches round-robin to data-parallel ranks, and DataLoader
    workers collate ahead of the model.
    """

    def __init__(self, samples: Dataset, batches: Sequence[Sequence[int]], pad_id: int) -> None:
        self.samples = samples
        self.batches = [list(batch) for batch in batches]
        self.pad_id = pad_id

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        """The collated batch; ``{}`` for an empty one (:func:`spread_over_ranks`), which predicts nothing."""
        batch = self.batches[item]
        return collate_proteins([self.samples[i] for i in batch], self.pad_id) if batch else {}


def first_item(items: list[Any]) -> Any:
    """Collate for :class:`PredictionBatches`: the one already-collated batch of a micro-batch."""
    return items[0]


def mask_tokens(
    ids: torch.Tensor, tokenizer: ProteinTokenizer, mask_prob: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT-style masking of ``<cls> residues <eos>`` ids: ``(tokens, labels)``, labels -100 where not chosen.

    ``mask_prob`` of the residues are chosen (at least one); of those 80% become ``<mask>``, 10% a random
    standard amino acid and 10% stay.
    """
    residue = torch.zeros_like(ids, dtype=torch.bool)
    residue[1:-1] = True
    chosen = (torch.rand(ids.shape, generator=generator) < mask_prob) & residue
    if not chosen.any():  # every sequence contributes at least one prediction
        chosen[1 + int(torch.randint(len(ids) - 2, (1,), generator=generator))] = True
    action = torch.rand(ids.shape, generator=generator)
    random_residues = tokenizer.residue_ids[torch.randint(len(tokenizer.residue_ids), ids.shape, generator=generator)]
    tokens = torch.where(chosen & (action < 0.8), torch.full_like(ids, tokenizer.mask_id), ids)
    tokens = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_residues, tokens)
    return tokens, torch.where(chosen, ids, torch.full_like(ids, -100))


_PAD_VALUES = {"labels": -100, "loss_mask": 0}


def collate_proteins(items: list[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad items into ``[b, s]`` tensors plus an ``attention_mask`` (True on real tokens).

    ``host_lengths`` is a list of each item's token count: a plain list, so that no strategy moves it to the
    device and steps can plan on the host without waiting for the device. Token tensors are padded with
    ``pad_id``, ``labels`` with -100, ``loss_mask`` with 0; scalars are stacked.
    """
    length = max(item["tokens"].shape[0] for item in items)
    batch: dict[str, torch.Tensor] = {}
    for key, first in items[0].items():
        if first.dim() == 0:
            batch[key] = torch.stack([item[key] for item in items])
            continue
        padded = torch.full((len(items), length), _PAD_VALUES.get(key, pad_id), dtype=first.dtype)
        for row, item in enumerate(items):
            padded[row, : item[key].shape[0]] = item[key]
        batch[key] = padded
    batch["attention_mask"] = torch.zeros(len(items), length, dtype=torch.bool)
    for row, item in enumerate(items):
        batch["attention_mask"][row, : item["tokens"].shape[0]] = True
    batch["host_lengths"] = [item["tokens"].shape[0] for item in items]  # type: ignore[assignment]
    return batch


def data_step(dataloader_iter: Iterator[dict[str, Any]]) -> dict[str, Any]:
    """Move one micro-batch to the compute device; ``padding`` is the attention mask, or None when nothing is padded.

    Decided on the host from ``host_lengths`` (no wait for the device): torch's flash attention kernel takes
    no mask, so full-length batches run on it. ``host_lengths`` becomes a CPU tensor.
    """
    batch = next(dataloader_iter)
    device = compute_device()  # the trainer's (set by BionemoLightningModule)
    lengths = batch.get("host_lengths")
    host_lengths = torch.as_tensor(lengths) if lengths is not None else batch["attention_mask"].sum(dim=1).cpu()
    padded = bool(host_lengths.min() != batch["attention_mask"].shape[1])
    moved: dict[str, Any] = {
        key: value.to(device, non_blocking=True) for key, value in batch.items() if isinstance(value, torch.Tensor)
    }
    moved["padding"] = moved["attention_mask"] if padded else None
    moved["host_lengths"] = host_lengths
    return moved


def training_data_step(dataloader_iter: Iterator[dict[str, Any]]) -> dict[str, Any]:
    """:func:`data_step` for training and validation, with context parallelism's split of the targets.

    Under context parallelism ``labels`` and ``loss_mask`` become this rank's chunk of the sequence (megatron's
    convention: a rank's loss covers its own positions; the model still takes every token, see
    :class:`bionemo.esm2.model.esm2.ESM2Model`).
    """
    from bionemo.layers.context_parallel import context_parallel_group, local_chunk

    batch = data_step(dataloader_iter)
    group = context_parallel_group()
    if group is not None:
        batch["labels"] = local_chunk(batch["labels"], 1, group, fill=-100)
        batch["loss_mask"] = local_chunk(batch["loss_mask"], 1, group, fill=0)
    return batch
