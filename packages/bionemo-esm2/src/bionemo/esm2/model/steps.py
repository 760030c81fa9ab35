"""Forward steps of the ESM-2 recipes: training / validation and prediction (``ForwardStep`` contracts)."""

import os
from collections.abc import Sequence
from typing import Any

import torch

from bionemo.esm2.model.contacts import ContactHead, ContactLogits, flat_contacts
from bionemo.esm2.model.esm2 import vocab_logits
from bionemo.esm2.model.masked_copies import copy_groups
from bionemo.esm2.model.packing import repad, unpad
from bionemo.losses import ParallelGroups, token_cross_entropy

__all__ = ["UNPADDED_SWITCH", "attention_dtype", "forward_step", "make_predict_step", "runs_unpadded"]


def forward_step(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | torch.Tensor:
    """Training / validation: ``{"token_logits": [s, b, v_local]}`` of the masked ``tokens``.

    A padded batch runs on its real tokens concatenated where :func:`runs_unpadded` (CUDA in bf16 / fp16, one
    pipeline stage, no context or sequence parallelism): the variable-length flash kernel instead of masked
    attention (on an H100, 16 sequences of up to 1,026 tokens: 1.1 ms per layer, forward and backward, against
    4.1 ms for the memory-efficient kernel that takes the padding mask), and no GEMM or LayerNorm work on padding.
    The logits come back in the padded layout (zeros at padding, which the loss masks), so the loss and its
    reduction are the same (docs/benchmarks.md#training-throughput-as-a-share-of-peak).

    Under context parallelism the logits of this rank's chunk of the sequence, as the batch's labels
    (:func:`bionemo.esm2.data.mlm.training_data_step`). On a pipeline stage before the last: the stage's output
    tensor itself (hidden states ``[s, b, h]``), which megatron's schedule sends to the next stage.
    """
    tokens, padding = batch["tokens"], batch.get("padding")
    if padding is not None and "host_lengths" in batch and runs_unpadded(model, tokens):
        ids, sequences, index = unpad(tokens, batch["host_lengths"])
        logits = model(ids, None, unpadded=sequences)
        return {"token_logits": repad(logits, index, *tokens.shape)}
    output = model(tokens, padding, gather_context=False)
    return {"token_logits": output} if ParallelGroups.current().is_last_stage else output


UNPADDED_SWITCH = "BIONEMO_UNPADDED_TRAINING"
"""Set to ``0`` to keep training and fine-tuning batches padded (:func:`runs_unpadded`), for A/B measurements."""


def runs_unpadded(model: Any, tokens: torch.Tensor) -> bool:
    """Whether a padded training, validation or fine-tuning batch runs on its real tokens concatenated.

    That needs a variable-length flash kernel for the dtype attention runs in (CUDA, bf16 / fp16:
    :func:`attention_dtype`), no attention dropout while training (the kernel has none), one pipeline stage
    (megatron's schedule sends fixed ``[s, b, h]`` shapes between stages), and no context or sequence parallelism
    (their chunks are of the padded sequence). ``BIONEMO_UNPADDED_TRAINING=0`` switches it off.
    """
    from bionemo.lightning import varlen_attention_available

    if not tokens.is_cuda or os.environ.get(UNPADDED_SWITCH, "1") == "0":
        return False
    config = getattr(model, "config", None)
    if model.training and float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0:
        return False
    if int(getattr(config, "pipeline_model_parallel_size", 1) or 1) > 1:
        return False
    if int(getattr(config, "context_parallel_size", 1) or 1) > 1 or getattr(config, "sequence_parallel", False):
        return False
    return varlen_attention_available(attention_dtype(model))


def attention_dtype(model: Any) -> torch.dtype:
    """The dtype a model's attention runs in: autocast's, else megatron's ``bf16`` / ``fp16``, else its weights'.

    ``config.params_dtype`` does not tell: NeMo's mixed precision sets it to float32 on the model's config (its
    ``params_dtype`` default) and runs the model in bf16 / fp16 through megatron's ``Float16Module``, marking the
    config with ``bf16`` / ``fp16``.
    """
    if torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    config = getattr(model, "config", None)
    if getattr(config, "bf16", False):
        return torch.bfloat16
    if getattr(config, "fp16", False):
        return torch.float16
    weight = next(iter(model.parameters()), None)
    return weight.dtype if weight is not None else getattr(config, "params_dtype", None) or torch.float32


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
    output_dtype: torch.dtype = torch.float32,
    unpadded: bool = False,
    pseudo_perplexity_tokens: int | None = None,
    contact_head: ContactHead | None = None,
):
    """The prediction forward step over :class:`bionemo.esm2.data.mlm.PredictionDataset` batches.

    Outputs for ``b`` sequences (only those asked for), all from the unmasked sequence unless said otherwise;
    embeddings, ``cls`` and logits in ``output_dtype``, perplexities float32:

    - ``embeddings [b, h]``: mean over residue positions (no ``<cls>``, ``<eos>`` or padding) of the last
      layer after the final LayerNorm; ``embeddings.layer{K} [b, h]`` the same for each of ``layers``
      (absolute: 0 = the embedding output, ``num_layers`` = after the final LayerNorm).
    - ``residue_embeddings [b, s - 2, h]`` (residues only, zeros beyond each sequence's length; the last layer)
      and ``residue_embeddings.layer{K}`` for each of ``layers``.
    - ``cls [b, h]``: the last layer's ``<cls>`` vector.
    - ``logits [b, s, vocab_size]``: raw scores, position 0 = ``<cls>``, zeros at padding positions.
    - ``perplexity [b]``: exp of the mean cross-entropy over the masked positions of ``masked_tokens``.
    - ``pseudo_perplexity [b]``: exp of the mean over residues of the true residue's cross-entropy with only
      that residue masked (one copy of the sequence per residue; the copies of the batch's sequences run in
      forward passes of up to ``pseudo_perplexity_tokens`` tokens, by default the batch's padded size).
    - ``contacts [b, max L_i^2]`` (with ``contact_head``): float32 contact probabilities of residue pairs, row
      ``i`` sequence ``i``'s ``[L_i, L_i]`` row-major then zeros (:func:`bionemo.esm2.model.contacts.flat_contacts`),
      from the attention maps of the unmasked forward pass; padded batches at tensor parallel size 1 only
      (``ValueError`` otherwise).

    ``unpadded=True`` runs the unmasked and the masked forward on the concatenated real tokens
    (:mod:`bionemo.esm2.model.packing`): the same outputs without padding work (variable-length flash attention on GPUs
    in fp16 / bf16), also for the pseudo-perplexity's copies.

    Under pipeline parallelism a micro-batch passes through the stages once, as one forward of the unmasked
    sequence: a stage before the last returns its output tensor (hidden states ``[s, b, h]``, sent on by megatron's
    schedule), the last stage the outputs above. ``perplexity`` and ``pseudo_perplexity`` (more forwards than one)
    and ``layers`` / ``contact_head`` (hidden states or attention maps of every layer) need the whole model on each
    rank: with several pipeline stages the step raises ``ValueError`` on every stage at its first call.
    """
    last = num_layers if num_layers is not None else -1
    wanted = [k for k in dict.fromkeys(layers) if k != last]

    def predict_step(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | torch.Tensor:
        groups = ParallelGroups.current()
        if groups.pipeline is not None and torch.distributed.get_world_size(groups.pipeline) > 1:
            _check_one_forward(
                perplexity=perplexity,
                pseudo_perplexity=pseudo_perplexity,
                layers=wanted,
                contacts=contact_head is not None,
            )
            if not groups.is_last_stage:
                return model(batch["tokens"], batch.get("padding"))
        out: dict[str, torch.Tensor] = {}
        real = batch["attention_mask"]
        contacts = None if contact_head is None else _contact_logits(contact_head, batch, unpadded=unpadded)
        if embeddings or logits or residues or cls or wanted or contacts is not None:
            token_logits, hidden, extra = _forward(
                model, batch, wanted, unpadded=unpadded, output_logits=logits, attention_maps=contacts
            )
            weights = _residue_mask(real).unsqueeze(-1).float()
            per_layer = {"": hidden, **{f".layer{k}": hidden if k == last else extra[k] for k in layers}}
            for suffix, states in per_layer.items():
                states = states.transpose(0, 1).float() * weights  # [b, s, h], zero outside residues
                if embeddings or suffix:
                    mean = states.sum(dim=1) / weights.sum(dim=1).clamp(min=1)
                    out["embeddings" + suffix] = mean.to(output_dtype)
                if residues:
                    out["residue_embeddings" + suffix] = states[:, 1:-1].to(output_dtype)
            if cls:
                out["cls"] = hidden[0].to(output_dtype)
            if logits and token_logits is not None:
                full = vocab_logits(token_logits, vocab_size).transpose(0, 1).float()  # [b, s, v]
                out["logits"] = (full * real.unsqueeze(-1)).to(output_dtype)
        if contacts is not None:
            residues_per_sequence = torch.as_tensor(batch["host_lengths"]) - 2  # host values: no wait for the device
            out["contacts"] = flat_contacts(contacts.probabilities(), residues_per_sequence)
        if pseudo_perplexity:
            residues_per_sequence = (real.sum(dim=1) - 2).clamp(min=1)
            sums = _pseudo_loss_sums(
                model, batch, mask_id, unpadded=unpadded, tokens_per_forward=pseudo_perplexity_tokens
            )
            out["pseudo_perplexity"] = torch.exp(sums / residues_per_sequence)
        if perplexity:
            out["perplexity"] = _masked_perplexity(model, batch, unpadded=unpadded)
        return out

    return predict_step


def _check_one_forward(
    *, perplexity: bool, pseudo_perplexity: bool, layers: Sequence[int], contacts: bool = False
) -> None:
    """Refuse, under pipeline parallelism, outputs that take more than the one forward through the stages."""
    named = (("perplexity", perplexity), ("pseudo_perplexity", pseudo_perplexity), ("contacts", contacts))
    asked = [name for name, on in named if on]
    if layers:
        asked.append(f"layers {list(layers)}")
    if asked:
        raise ValueError(
            f"prediction with pipeline parallelism computes embeddings, residue embeddings, cls and logits of the "
            f"last layer; {', '.join(asked)} need the whole model on each rank: predict them with pipeline "
            "parallel size 1"
        )


def _masked_perplexity(model: Any, batch: dict[str, torch.Tensor], *, unpadded: bool) -> torch.Tensor:
    """``[b]`` exp of the mean cross-entropy over the masked positions of ``batch["masked_tokens"]``."""
    tokens, padding, lengths = batch["masked_tokens"], batch.get("padding"), batch["host_lengths"]
    masked_logits = _logits(model, tokens, padding, lengths, unpadded=unpadded)
    per_token = token_cross_entropy(masked_logits, batch["labels"], ParallelGroups.current().tensor)
    masked = (batch["labels"] >= 0).sum(dim=1).clamp(min=1)
    return torch.exp(per_token.float().sum(dim=1) / masked)


def _residue_mask(real: torch.Tensor) -> torch.Tensor:
    """``[b, s]`` True at residues: real tokens but ``<cls>`` (position 0) and ``<eos>`` (each row's last).

    Comparisons only: an indexed assignment of a Python scalar waits for the device (it was the prediction loop's
    only sync per batch: docs/benchmarks.md#prediction-loop).
    """
    positions = torch.arange(real.shape[1], device=real.device)
    eos = real.sum(dim=1, keepdim=True) - 1
    return real.bool() & (positions > 0) & (positions < eos)


def _contact_logits(head: ContactHead, batch: dict[str, Any], *, unpadded: bool) -> ContactLogits:
    """This batch's contact accumulator; refuses batches whose every attention map it would not see."""
    if unpadded or ParallelGroups.current().tensor_parallel_size() > 1:
        raise ValueError("contacts: padded batches at tensor parallel size 1 only (each head's attention map)")
    return head.logits(batch["tokens"], batch["attention_mask"])


def _forward(
    model: Any,
    batch: dict[str, Any],
    layers: list[int],
    *,
    unpadded: bool,
    output_logits: bool,
    attention_maps: ContactLogits | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[int, torch.Tensor]]:
    """``(logits [s, b, v_local] or None, last hidden [s, b, h], {K: hidden [s, b, h]})`` of the unmasked tokens.

    ``attention_maps`` receives every layer's attention probabilities (padded batches only).
    """
    tokens = batch["tokens"]
    if not unpadded:
        maps = {} if attention_maps is None else {"attention_maps": attention_maps}
        out = model(
            tokens, batch.get("padding"), output_hidden=True, hidden_layers=layers, output_logits=output_logits, **maps
        )
        return out if layers else (*out, {})
    ids, sequences, index = unpad(tokens, batch["host_lengths"])
    out = model(ids, None, output_hidden=True, hidden_layers=layers, unpadded=sequences, output_logits=output_logits)
    token_logits, hidden, extra = out if layers else (*out, {})
    b, s = tokens.shape

    def back(states: torch.Tensor) -> torch.Tensor:
        return repad(states, index, b, s)

    return (
        None if token_logits is None else back(token_logits),
        back(hidden),
        {k: back(v) for k, v in extra.items()},
    )


def _logits(
    model: Any, tokens: torch.Tensor, padding: torch.Tensor | None, host_lengths: Any, *, unpadded: bool
) -> torch.Tensor:
    """Logits ``[s, b, v_local]`` of right-padded ``tokens [b, s]``.

    ``unpadded``: run on the real tokens only (:mod:`bionemo.esm2.model.packing`), zeros at the padding (its labels are
    ignored).
    """
    if not unpadded:
        return model(tokens, padding)
    ids, sequences, index = unpad(tokens, host_lengths)
    return repad(model(ids, None, unpadded=sequences), index, *tokens.shape)


def _pseudo_loss_sums(
    model: Any,
    batch: dict[str, Any],
    mask_id: int,
    *,
    unpadded: bool = False,
    tokens_per_forward: int | None = None,
) -> torch.Tensor:
    """``[b]`` per sequence, the summed cross-entropy of each residue predicted with only that residue masked.

    The copies (one per residue) of all the batch's sequences are grouped into forward passes of at most
    ``tokens_per_forward`` tokens (:func:`bionemo.esm2.model.masked_copies.copy_groups`; None: the batch's own
    padded size), each group cut to its longest copy. The groups are planned on the host from
    ``batch["host_lengths"]`` (tokens per sequence, set by :func:`bionemo.esm2.data.mlm.data_step` before the copy to
    the device), so the loop never waits for the device; ``unpadded``: each group runs concatenated, without its
    padding.
    """
    tokens, real = batch["tokens"], batch["attention_mask"]
    b, s = tokens.shape
    host_lengths = torch.as_tensor(batch["host_lengths"])
    lengths = host_lengths - 2  # residues
    rows = torch.repeat_interleave(torch.arange(b), lengths)  # one copy per residue
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.arange(len(rows)) - starts[rows] + 1  # 1..L of each sequence
    row_lengths = host_lengths[rows]
    totals = torch.zeros(b, device=tokens.device, dtype=torch.float32)
    mask = torch.full((), mask_id, dtype=tokens.dtype, device=tokens.device)  # a device value: no sync to assign
    group = ParallelGroups.current().tensor
    budget = tokens_per_forward or b * s
    for start, stop, width in copy_groups(host_lengths.tolist(), budget, unpadded=unpadded):
        host_rows = rows[start:stop]
        sequence = host_rows.to(tokens.device, non_blocking=True)
        position = positions[start:stop].to(tokens.device, non_blocking=True)
        copies = tokens[sequence, :width].clone()
        picked = torch.arange(stop - start, device=tokens.device)
        labels = torch.full_like(copies, -100)
        labels[picked, position] = copies[picked, position]
        copies[picked, position] = mask
        padded = bool(row_lengths[start:stop].min() < width)  # host values: no wait for the device
        padding = real[sequence, :width] if padded else None
        logits = _logits(model, copies, padding, row_lengths[start:stop], unpadded=unpadded)
        loss = token_cross_entropy(logits, labels, group).sum(dim=1)  # [copies]
        totals.index_add_(0, sequence, loss.float())
    return totals
