"""Worker functions for the parallel-reduction tests (importable by spawned processes)."""

import torch

from bionemo.callbacks import PerplexityLoggingCallback
from bionemo.losses import MaskedTokenLossReduction, ParallelGroups

S, B, V = 8, 4, 10


def global_batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(S, B, V, generator=gen)
    labels = torch.randint(0, V, (B, S), generator=gen)
    mask = (torch.rand(B, S, generator=gen) > 0.4).float()
    return logits, labels, mask


def tp_worker(rank, world_size):
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)
    logits, labels, mask = global_batch()
    local = logits[..., rank * V // 2 : (rank + 1) * V // 2].clone().requires_grad_()
    reduction = MaskedTokenLossReduction()
    assert reduction.groups.tensor_parallel_size() == 2
    loss_sum, n, reduced = reduction.forward({"labels": labels, "loss_mask": mask}, {"token_logits": local})
    (loss_sum / n).backward()
    return {"mean": reduction.reduce([reduced]).item(), "grad": local.grad, "local_input": local.detach()}


class _Trainer:
    """The trainer attributes PerplexityLoggingCallback reads."""

    def __init__(self, stage: str):
        self.sanity_checking = False
        self.training = stage == "train"
        self.validating = stage == "validate"


class _Module:
    def __init__(self):
        self.logged = {}
        self.device = torch.device("cpu")

    def log(self, name, value, **kwargs):
        self.logged[name] = float(value)


class _Step:
    def __init__(self, trainer, module):
        self.trainer, self.pl_module = trainer, module


def ppl_worker(rank, world_size, layout):
    """Each rank sees its share of two validation steps of 2 micro-batches; returns the logged val_ppl."""
    from megatron.core import parallel_state

    if layout == "cp":
        parallel_state.initialize_model_parallel(context_parallel_size=world_size)
    else:
        parallel_state.initialize_model_parallel()
    groups = ParallelGroups.current()
    assert groups.data_context_size() == world_size
    callback = PerplexityLoggingCallback(log_val=True, log_train=True)
    module = _Module()
    trainer = _Trainer("validate")
    callback.on_validation_epoch_start(trainer, module)
    reduction = MaskedTokenLossReduction(validation_step=True)
    outputs, reduced = [], None
    for step in range(2):
        outputs = []
        for micro in range(2):
            logits, labels, mask = global_batch(seed=10 * step + micro)
            if layout == "cp":  # this rank holds one contiguous half of the sequence
                half = slice(rank * S // 2, (rank + 1) * S // 2)
                logits, labels, mask = logits[half], labels[:, half], mask[:, half]
            else:  # this rank holds half of the samples
                half = slice(rank * B // 2, (rank + 1) * B // 2)
                logits, labels, mask = logits[:, half], labels[half], mask[half]
            outputs.append(reduction.forward({"labels": labels, "loss_mask": mask}, {"token_logits": logits})[2])
        reduced = reduction.reduce(outputs)
        callback.on_megatron_reduce_microbatches_end(_Step(trainer, module), outputs, reduction, reduced)
    callback.on_validation_epoch_end(trainer, module)
    # A training step logs exp of the reduced loss of that step.
    train_module, train_trainer = _Module(), _Trainer("train")
    callback.on_megatron_reduce_microbatches_end(_Step(train_trainer, train_module), outputs, reduction, reduced)
    return {"val_ppl": module.logged["val_ppl"], "train_ppl": train_module.logged["train_ppl"]}


def esm2_inputs():
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(5, 26, (3, 12), generator=gen)
    valid = torch.arange(12)[None, :] < torch.tensor([12, 9, 7])[:, None]
    return tokens, valid


def esm2_config(tp: int):
    from bionemo.esm2.model import ESM2Config

    return ESM2Config(
        num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, seq_length=20,
        tensor_model_parallel_size=tp, use_cpu_initialization=True,
    )  # fmt: skip


def esm2_logits(model, tokens, valid):
    """Full-vocabulary logits [b, s, v]; vocab shards gathered on CPU (megatron's gather is CUDA-only)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    logits = model(tokens, valid).transpose(0, 1)  # [b, s, v_local]
    size = parallel_state.get_tensor_model_parallel_world_size()
    if size > 1:
        shards = [torch.empty_like(logits) for _ in range(size)]
        dist.all_gather(shards, logits.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
        logits = torch.cat(shards, dim=-1)
    return logits[..., :33]


def esm2_tp_worker(rank, world_size):
    """A tensor-parallel encoder's logits and its gathered full weights; checks the round trip on every rank."""
    from megatron.core import parallel_state

    from bionemo.esm2.checkpoints.weights import apply_weights, full_state_dict

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)
    torch.manual_seed(0)
    model = esm2_config(world_size).configure_model().eval()
    tokens, valid = esm2_inputs()
    logits = esm2_logits(model, tokens, valid)
    full = full_state_dict(model)
    torch.manual_seed(1)
    other = esm2_config(world_size).configure_model().eval()
    apply_weights(other, full)
    for name, value in model.state_dict().items():
        if isinstance(value, torch.Tensor) and not name.endswith("_extra_state"):
            assert torch.equal(value, other.state_dict()[name]), name
    return {"logits": logits.detach(), "full": full}
