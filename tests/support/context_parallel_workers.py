"""Worker of the context-parallel ESM-2 test (importable by spawned processes)."""

import torch

from bionemo.losses import masked_token_loss_sums

S = 13  # not a multiple of 2: the last chunk is padded


def inputs():
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(4, 24, (3, S), generator=gen)
    tokens[:, 2] = 32  # <mask>: token dropout's ratio must come from the whole sequence
    real = torch.arange(S)[None, :] < torch.tensor([S, 9, 6])[:, None]
    labels = torch.where(torch.rand(3, S, generator=gen) < 0.5, tokens, -100)
    return tokens, real, labels


def config(cp: int):
    from bionemo.esm2.model import ESM2Config

    return ESM2Config(
        num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, seq_length=20,
        context_parallel_size=cp, use_cpu_initialization=True,
    )  # fmt: skip


def cp_worker(rank, world_size, padded: bool):
    """ESM2Model at context parallel 2 vs the same weights without: outputs, and the loss gradient summed over
    the context-parallel ranks (each rank's loss covers its chunk, as ``training_data_step`` chunks labels)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from bionemo.esm2.data import training_data_step
    from bionemo.esm2.model import ESM2Model
    from bionemo.esm2.model.steps import forward_step
    from bionemo.layers.context_parallel import context_parallel_group, local_chunk

    parallel_state.initialize_model_parallel(context_parallel_size=world_size)
    group = context_parallel_group()
    assert group is not None
    torch.manual_seed(0)
    reference = ESM2Model(config(1))
    model = ESM2Model(config(world_size))
    model.load_state_dict(reference.state_dict())
    tokens, real, labels = inputs()
    mask = real if padded else None
    if not padded:
        real = torch.ones_like(real)
    labels = labels.masked_fill(~real, -100)
    logits, hidden, layers = model(tokens, mask, hidden_layers=[0, 1, 2])
    # the training path: the data step chunks the targets, the forward step returns this rank's chunk of logits
    collated = {"tokens": tokens, "labels": labels, "loss_mask": real, "attention_mask": real,
                "host_lengths": real.sum(dim=1).tolist()}  # fmt: skip
    batch = training_data_step(iter([collated]))
    assert torch.equal(batch["labels"], local_chunk(labels, 1, group, -100))
    assert (batch["padding"] is None) == (not padded)
    chunk_logits = forward_step(model, batch)["token_logits"]
    loss_sum, _ = masked_token_loss_sums(chunk_logits, batch["labels"], batch["loss_mask"])
    loss_sum.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    for grad in grads.values():
        dist.all_reduce(grad, group=group)
    ref_logits, ref_hidden, ref_layers = reference(tokens, mask, hidden_layers=[0, 1, 2])
    masked_token_loss_sums(ref_logits, labels, real)[0].backward()
    ref_grads = {name: p.grad for name, p in reference.named_parameters() if p.grad is not None}
    return {
        "logits": (logits.detach(), ref_logits.detach()),
        "hidden": (hidden.detach(), ref_hidden.detach()),
        "layers": {k: (layers[k].detach(), ref_layers[k].detach()) for k in layers},
        "grads": {name: (grads.get(name), ref) for name, ref in ref_grads.items()},
        "real": real,
    }
