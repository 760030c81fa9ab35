"""Train a tiny ESM-2 for a few steps on one layout (1 process, DP, TP, PP or CP) over gloo, in plain torch.

Megatron's pipeline schedules and DDP run only on CUDA, so on CPU this file plays their part around the project's
own pieces, which are what the layout matrix tests: the ESM-2 model and its tensor / pipeline / context-parallel
layers, ``training_data_step`` and ``forward_step``, ``MaskedTokenLossReduction``, the global-batch sampler, the
megatron weight-decay groups, and whole-model weights in and out (``apply_weights`` / ``full_state_dict``).

What stands in for megatron here, as megatron-core 0.15.3 does it with ``calculate_per_token_loss=True``: each
micro-batch back-propagates its loss sum; pipeline stages pass activations forward and their gradients back
(all forwards of a micro-batch, then its backward); gradients are summed over the data- and context-parallel
ranks, the tied word-embedding gradients over the first and last stage, and every gradient is divided by the
step's global token count before Adam steps.
"""

from typing import Any

import torch
import torch.distributed as dist

from support.pipeline_workers import build_stage

SEQUENCES = 40
MICRO, GLOBAL, STEPS = 2, 8, 3
LR = 1e-2


def records(n: int, seed: int) -> list:
    from bionemo.esm2.data.readers import SequenceRecord

    gen = torch.Generator().manual_seed(seed)
    alphabet = "ACDEFGHIKLMNPQRSTVWY"
    out = []
    for i in range(n):
        length = int(torch.randint(8, 30, (1,), generator=gen))
        letters = torch.randint(len(alphabet), (length,), generator=gen).tolist()
        out.append(SequenceRecord(id=f"s{i}", sequence="".join(alphabet[k] for k in letters)))
    return out


def config(tp: int = 1, pp: int = 1, cp: int = 1):
    from bionemo.esm2.model import ESM2Config

    return ESM2Config(
        num_layers=4, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, seq_length=40,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
        pipeline_dtype=torch.float32, variable_seq_lengths=pp > 1, moe_token_dispatcher_type="alltoall",
        use_cpu_initialization=True,
    )  # fmt: skip


def initial_weights() -> dict[str, torch.Tensor]:
    """The whole model every layout starts from (built without any parallel state)."""
    from bionemo.esm2.checkpoints.weights import full_state_dict
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel(cuda=False)
    torch.manual_seed(0)
    return full_state_dict(config().configure_model())


def _groups() -> dict[str, Any]:
    from megatron.core import parallel_state as ps

    return {
        "data_context": ps.get_data_parallel_group(with_context_parallel=True),
        "data": ps.get_data_parallel_group(),
        "pipeline": ps.get_pipeline_model_parallel_group(),
        "tensor": ps.get_tensor_model_parallel_group(),
        "embedding": ps.get_embedding_group(),
        "dp_rank": ps.get_data_parallel_rank(),
        "dp_size": ps.get_data_parallel_world_size(),
        "pp_rank": ps.get_pipeline_model_parallel_rank(),
        "pp_size": ps.get_pipeline_model_parallel_world_size(),
        "first": ps.is_pipeline_first_stage(),
        "last": ps.is_pipeline_last_stage(),
    }


def _layout(global_batch: int, data_parallel: int):
    from bionemo.lightning.global_batches import BatchLayout

    return BatchLayout(micro_batch_size=MICRO, global_batch_size=global_batch, data_parallel_size=data_parallel)


def _micro_batches(dataset, layout, rank: int) -> list[dict[str, Any]]:
    from bionemo.esm2.data import collate_proteins
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning.global_batches import GlobalBatchSampler

    indices = list(GlobalBatchSampler(len(dataset), layout, rank=rank))
    pad = ProteinTokenizer().pad_id
    return [collate_proteins([dataset[i] for i in indices[k : k + MICRO]], pad) for k in range(0, len(indices), MICRO)]


def _forward_backward(model, batch: dict[str, Any], groups: dict[str, Any], *, backward: bool):
    """One micro-batch through this rank's stage (PP 1 or 2); the loss sum and token count on the last stage."""
    from bionemo.esm2.data import training_data_step
    from bionemo.esm2.model.steps import forward_step
    from bionemo.losses import MaskedTokenLossReduction

    step = training_data_step(iter([batch]))
    b, s = step["tokens"].shape
    hidden_in = None
    if not groups["first"]:
        hidden_in = torch.empty(s, b, model.config.hidden_size)
        dist.recv(hidden_in, src=dist.get_global_rank(groups["pipeline"], groups["pp_rank"] - 1))
        hidden_in.requires_grad_(backward)
        model.set_input_tensor(hidden_in)
    output = forward_step(model, step)
    if not groups["last"]:
        dist.send(output.detach().contiguous(), dst=dist.get_global_rank(groups["pipeline"], groups["pp_rank"] + 1))
        if backward:
            grad = torch.empty_like(output)
            dist.recv(grad, src=dist.get_global_rank(groups["pipeline"], groups["pp_rank"] + 1))
            output.backward(grad)
        return torch.zeros(()), torch.zeros(())
    reduction = MaskedTokenLossReduction(validation_step=not backward)
    loss_sum, num_tokens, _ = reduction.forward(step, output)
    if backward:
        loss_sum.backward()
        if hidden_in is not None:
            dist.send(hidden_in.grad.contiguous(), dst=dist.get_global_rank(groups["pipeline"], groups["pp_rank"] - 1))
    return loss_sum.detach(), num_tokens.detach().float()


def _global_sum(value: torch.Tensor, groups: dict[str, Any]) -> torch.Tensor:
    """Sum over the data- and context-parallel ranks and the pipeline stages (only the last one holds losses)."""
    value = value.clone()
    dist.all_reduce(value, group=groups["data_context"])
    dist.all_reduce(value, group=groups["pipeline"])
    return value


def _finish_gradients(model, tokens: torch.Tensor, groups: dict[str, Any]) -> None:
    for param in model.parameters():
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        dist.all_reduce(param.grad, group=groups["data_context"])
    if groups["pp_size"] > 1 and (groups["first"] or groups["last"]):
        dist.all_reduce(model.shared_embedding_or_output_weight().grad, group=groups["embedding"])
    for param in model.parameters():
        param.grad /= tokens.clamp(min=1.0)


def _gathered_logits(model, batch: dict[str, Any], groups: dict[str, Any]) -> torch.Tensor | None:
    """Whole-vocabulary, whole-sequence logits ``[s, b, 33]`` of unmasked tokens (last stage; None elsewhere)."""
    from bionemo.esm2.data import data_step

    step = data_step(iter([batch]))
    b, s = step["tokens"].shape
    if not groups["first"]:
        hidden_in = torch.empty(s, b, model.config.hidden_size)
        dist.recv(hidden_in, src=dist.get_global_rank(groups["pipeline"], groups["pp_rank"] - 1))
        model.set_input_tensor(hidden_in)
    output = model(step["tokens"], step["padding"])
    if not groups["last"]:
        dist.send(output.contiguous(), dst=dist.get_global_rank(groups["pipeline"], groups["pp_rank"] + 1))
        return None
    shards = [torch.empty_like(output) for _ in range(dist.get_world_size(groups["tensor"]))]
    dist.all_gather(shards, output.contiguous(), group=groups["tensor"])
    return torch.cat(shards, dim=-1)[..., :33]


def as_on_gpus() -> list[int]:
    """Let the training and fine-tuning steps decide as on GPUs with the variable-length kernel; count the unpads.

    Off CUDA the unpadded attention is SDPA under a block-diagonal mask, so the layouts' unpadded steps can be
    compared here; only the kernel check (CUDA tokens, a varlen kernel for the dtype) is stood in for.
    """
    import bionemo.lightning
    from bionemo.esm2.finetune import steps as finetune_steps
    from bionemo.esm2.model import packing, steps

    decide, unpad, unpadded = steps.runs_unpadded, packing.unpad, []

    class CudaTokens:
        is_cuda = True

    def runs_unpadded(model, tokens):
        available = bionemo.lightning.varlen_attention_available
        bionemo.lightning.varlen_attention_available = lambda dtype: True
        try:
            return decide(model, CudaTokens())
        finally:
            bionemo.lightning.varlen_attention_available = available

    def counted_unpad(*args):
        unpadded.append(1)
        return unpad(*args)

    steps.runs_unpadded = finetune_steps.runs_unpadded = runs_unpadded
    steps.unpad = packing.unpad = counted_unpad
    return unpadded


def train_worker(rank: int, world_size: int, layout: dict[str, int], weights: dict[str, torch.Tensor]):
    """Train ``STEPS`` steps on ``layout`` (``tp``, ``pp``, ``cp``; the rest of the world is data-parallel).

    ``layout["unpadded"]``: decide as on GPUs whether padded batches run unpadded (:func:`as_on_gpus`); the
    result's ``unpadded`` counts the micro-batches that did.
    """
    from megatron.core import parallel_state

    from bionemo.esm2.checkpoints.weights import apply_weights, full_state_dict
    from bionemo.esm2.data import MaskedProteinDataset, PredictionDataset, collate_proteins
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning.optimizer import megatron_param_groups

    tp, pp, cp = layout.get("tp", 1), layout.get("pp", 1), layout.get("cp", 1)
    unpadded = as_on_gpus() if layout.get("unpadded") else []
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tp, pp, context_parallel_size=cp)
    groups = _groups()
    torch.manual_seed(1)
    model = build_stage(config(tp, pp, cp)).train()
    apply_weights(model, weights)
    optimizer = torch.optim.AdamW(megatron_param_groups(model.named_parameters(), 0.01), lr=LR, weight_decay=0.0)
    tokenizer = ProteinTokenizer()
    train = MaskedProteinDataset(records(SEQUENCES, 1), tokenizer, seed=0, length=STEPS * GLOBAL)
    dp = groups["dp_size"]
    batches = _micro_batches(train, _layout(GLOBAL, dp), groups["dp_rank"])
    per_step = len(batches) // STEPS
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        sums = [
            _forward_backward(model, b, groups, backward=True) for b in batches[step * per_step : (step + 1) * per_step]
        ]
        loss_sum = _global_sum(torch.stack([s for s, _ in sums]).sum(), groups)
        tokens = _global_sum(torch.stack([n for _, n in sums]).sum(), groups)
        _finish_gradients(model, tokens, groups)
        optimizer.step()
        losses.append(float(loss_sum / tokens))
    model.eval()
    with torch.no_grad():
        val = MaskedProteinDataset(records(8, 2), tokenizer, seed=1)
        val_batches = _micro_batches(val, _layout(MICRO * dp, dp), groups["dp_rank"])
        sums = [_forward_backward(model, b, groups, backward=False) for b in val_batches]
        val_loss = _global_sum(torch.stack([s for s, _ in sums]).sum(), groups) / _global_sum(
            torch.stack([n for _, n in sums]).sum(), groups
        )
        predict = PredictionDataset(records(4, 3), tokenizer, masked=False)
        logits = _gathered_logits(model, collate_proteins([predict[i] for i in range(4)], tokenizer.pad_id), groups)
    return {
        "losses": losses,
        "val_loss": float(val_loss),
        "weights": full_state_dict(model),
        "logits": logits,
        "last_stage": groups["last"],
        "unpadded": len(unpadded),
    }
