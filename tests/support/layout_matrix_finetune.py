"""Fine-tune a tiny ESM-2 for a few steps on one layout (1 process, DP 2 or TP 2) over gloo, in plain torch.

The fine-tuning counterpart of :mod:`support.layout_matrix`, with the same stand-in for megatron's schedule and DDP
under ``calculate_per_token_loss=True`` (each micro-batch back-propagates its loss sum; gradients are summed over
the data-parallel ranks and divided by the step's global item count before Adam steps; tensor-parallel ranks hold
replicas of the head, whose gradients they compute alike). What it tests are the project's pieces:
``ESM2FinetuneConfig.configure_model``, ``prepare_model`` (base weights in, then LoRA, the head trainable),
``LabelledDataset`` + ``collate_labelled`` behind the global-batch sampler, ``data_step``,
``finetune_forward_step``, ``FinetuneLossReduction`` (``forward`` per micro-batch, ``reduce`` per step) and
``full_state_dict`` for the exported whole tensors (encoder, LoRA factors, head).

Two cases (:data:`CASES`): a sequence task (classification, mean-mlp head) training the whole encoder, and a token
task (token-classification with a mask, conv-token head) training LoRA adapters of rank 4: its micro-batches score
different numbers of residues, so the step's loss is a residue-weighted mean, not a mean of micro-batch means.

The 1-process run is the test process itself (``ensure_model_parallel``'s one-rank world); DP 2 and TP 2 run one
after the other in the same 2 gloo processes (:func:`layouts_worker`), since starting processes that import
megatron-core costs far more than the training.
"""

import dataclasses
import json
from typing import Any

import torch
import torch.distributed as dist

from support.layout_matrix import GLOBAL, LR, MICRO, SEQUENCES, STEPS, as_on_gpus, config, initial_weights, records

CASES = ("classification", "token-classification")
"""The sequence task (whole encoder trains) and the token task (LoRA adapters train)."""

LAYOUTS = {"dp2": 1, "tp2": 2}
"""The 2-process layouts by their tensor-parallel size (the rest of the world is data-parallel)."""

UNPADDED = ("dp2", "tp2")
"""The layouts run again with padded batches on their real tokens, as GPUs run them (``"<layout>-unpadded"``)."""

LORA_SEED = 5
"""Every layout seeds torch's generator with this just before ``prepare_model`` draws LoRA's ``A``."""

HEAD_GAIN = 10.0
"""The token head's output layer starts this much larger than its own initialisation."""

_HELIX, _STRAND = set("AELMQKRH"), set("VIYFWT")


def spec(case: str):
    """The fine-tuning spec of ``case`` (dropout 0 everywhere: ranks must compute what one process computes)."""
    from bionemo.esm2.finetune.head_config import HeadConfig, HeadKind
    from bionemo.esm2.finetune.spec import EncoderMode, FinetuneSpec, LoRASettings
    from bionemo.esm2.finetune.tasks import LabelVocabulary, Task

    if case == "classification":
        return FinetuneSpec(
            task=Task.CLASSIFICATION,
            head=HeadConfig(kind=HeadKind.MEAN_MLP, hidden_size=16, dropout=0.0),
            labels=LabelVocabulary.from_records(Task.CLASSIFICATION, ["label"], labelled(case, SEQUENCES, 1)),
        )
    return FinetuneSpec(
        task=Task.TOKEN_CLASSIFICATION,
        head=HeadConfig(kind=HeadKind.CONV_TOKEN, hidden_size=8, kernel_size=3, dropout=0.0),
        labels=LabelVocabulary.from_records(Task.TOKEN_CLASSIFICATION, ["ss"], labelled(case, SEQUENCES, 1)),
        encoder=EncoderMode.LORA,
        lora=LoRASettings(rank=4, alpha=8.0),
    )


def labelled(case: str, n: int, seed: int) -> list:
    """:func:`support.layout_matrix.records` labelled from their residues (token task: 20-100% of residues scored)."""
    from bionemo.esm2.finetune.tasks import LabelledRecord

    gen = torch.Generator().manual_seed(seed + 100)
    out = []
    for record in records(n, seed):
        sequence = record.sequence
        if case == "classification":
            share = sum(c in _HELIX for c in sequence) / len(sequence)
            label = "low" if share < 0.3 else "mid" if share < 0.45 else "high"
            out.append(LabelledRecord(id=record.id, sequence=sequence, labels=(label,)))
            continue
        states = "".join("H" if c in _HELIX else "E" if c in _STRAND else "L" for c in sequence)
        scored = 0.2 + 0.8 * float(torch.rand((), generator=gen))  # the share of scored residues varies by record
        mask = tuple(bool(m) for m in (torch.rand(len(sequence), generator=gen) < scored).tolist())
        out.append(LabelledRecord(id=record.id, sequence=sequence, labels=states, mask=mask))
    return out


def finetune_config(case: str, tp: int = 1):
    """:func:`support.layout_matrix.config`'s tiny ESM-2 as an ``ESM2FinetuneConfig`` holding ``spec(case)``."""
    from bionemo.esm2.finetune.model import ESM2FinetuneConfig

    base = config(tp)
    settings = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
    return ESM2FinetuneConfig(**settings, finetune=json.dumps(spec(case).to_json()))


def start_weights() -> dict[str, dict[str, torch.Tensor]]:
    """Per case, what every layout starts from: the pretrained encoder (no LM head) and the head's initialisation."""
    from bionemo.esm2.checkpoints.weights import unpadded
    from bionemo.esm2.finetune.module import encoder_tensors

    base = encoder_tensors(unpadded(initial_weights(), 33))
    starts = {}
    for case in CASES:
        torch.manual_seed(2)
        head = finetune_config(case).configure_model().head.state_dict()
        starts[case] = {**base, **{f"head.{k}": v.clone() for k, v in head.items()}}
    # a token head drawn larger: residues' losses differ from the first step, so weighting them matters at once
    starts["token-classification"]["head.classifier.weight"] *= HEAD_GAIN
    return starts


def _micro_batches(dataset, global_batch: int, dp_size: int, dp_rank: int) -> list[dict[str, Any]]:
    """This data-parallel rank's micro-batches of ``dataset`` in the order the global-batch sampler serves them."""
    from bionemo.esm2.finetune.data import collate_labelled
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning.global_batches import BatchLayout, GlobalBatchSampler

    layout = BatchLayout(micro_batch_size=MICRO, global_batch_size=global_batch, data_parallel_size=dp_size)
    indices = list(GlobalBatchSampler(len(dataset), layout, rank=dp_rank))
    pad = ProteinTokenizer().pad_id
    return [collate_labelled([dataset[i] for i in indices[k : k + MICRO]], pad) for k in range(0, len(indices), MICRO)]


def _through_model(model, reduction, micro_batch: dict[str, Any], *, backward: bool) -> dict[str, Any]:
    """One micro-batch through ``data_step``, ``finetune_forward_step`` and the reduction; back-propagates the sum."""
    from bionemo.esm2.data import data_step
    from bionemo.esm2.finetune.steps import finetune_forward_step

    batch = data_step(iter([micro_batch]))
    loss_sum, _count, reduced = reduction.forward(batch, finetune_forward_step(model, batch))
    if backward:
        loss_sum.backward()
    return reduced


def train(case: str, start: dict[str, torch.Tensor], groups) -> dict[str, Any]:
    """Fine-tune ``case`` for ``STEPS`` steps on the current parallel state; losses and the whole exported tensors.

    ``groups`` (a ``bionemo.losses.ParallelGroups``) names the data-parallel group the gradients, item counts and
    losses are summed over (``data_context`` None: one process).
    """
    from megatron.core import parallel_state

    from bionemo.esm2.checkpoints.weights import full_state_dict, unpadded
    from bionemo.esm2.finetune.data import LabelledDataset
    from bionemo.esm2.finetune.module import encoder_tensors, prepare_model
    from bionemo.esm2.finetune.reduction import FinetuneLossReduction
    from bionemo.lightning.optimizer import megatron_param_groups
    from bionemo.losses import LOSS_SUM_KEY

    data = groups.data_context
    dp_size, dp_rank = (1, 0) if data is None else (dist.get_world_size(data), dist.get_rank(data))
    finetune = finetune_config(case, parallel_state.get_tensor_model_parallel_world_size())
    task_spec = finetune.spec
    torch.manual_seed(1)
    model = finetune.configure_model().train()
    model.head.load_state_dict({k[len("head.") :]: v for k, v in start.items() if k.startswith("head.")})
    torch.manual_seed(LORA_SEED)
    prepare_model(model, spec=task_spec, tensors=encoder_tensors(start))
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(megatron_param_groups(trainable, 0.01), lr=LR, weight_decay=0.0)
    dataset = LabelledDataset(labelled(case, SEQUENCES, 1), task_spec.labels, length=STEPS * GLOBAL, group_size=GLOBAL)
    batches = _micro_batches(dataset, GLOBAL, dp_size, dp_rank)
    per_step = len(batches) // STEPS
    reduction = FinetuneLossReduction(task=task_spec.task, groups=groups)
    losses, micro_losses = [], []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        step_batches = batches[step * per_step : (step + 1) * per_step]
        reduced = [_through_model(model, reduction, b, backward=True) for b in step_batches]
        pairs = torch.stack([r[LOSS_SUM_KEY] for r in reduced])  # [micro-batches, 2]: loss sum, items
        count = pairs[:, 1].sum()
        if data is not None:
            dist.all_reduce(count, group=data)
        for _, param in trainable:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            if data is not None:
                dist.all_reduce(param.grad, group=data)
            param.grad /= count.clamp(min=1.0)
        optimizer.step()
        losses.append(float(reduction.reduce(reduced)))
        micro_losses.append(pairs.tolist())
    model.eval()
    with torch.no_grad():
        validation = FinetuneLossReduction(validation_step=True, task=task_spec.task, groups=groups)
        val = _micro_batches(LabelledDataset(labelled(case, 8, 2), task_spec.labels), MICRO * dp_size, dp_size, dp_rank)
        val_loss = validation.reduce([_through_model(model, validation, b, backward=False) for b in val])
    return {
        "losses": losses,
        "micro_losses": micro_losses,
        "val_loss": float(val_loss),
        "weights": unpadded(full_state_dict(model), 33),
    }


def one_process(starts: dict[str, dict[str, torch.Tensor]]) -> dict[str, dict[str, Any]]:
    """Every case on one process (the calling one, in megatron's one-rank parallel state)."""
    from megatron.core import parallel_state

    from bionemo.lightning import ensure_model_parallel
    from bionemo.losses import ParallelGroups

    ensure_model_parallel(cuda=False)
    assert parallel_state.get_tensor_model_parallel_world_size() == 1
    return {case: train(case, starts[case], ParallelGroups()) for case in CASES}


def layouts_worker(rank: int, world_size: int, starts: dict[str, dict[str, torch.Tensor]]) -> dict[str, Any]:
    """Every case on every layout of :data:`LAYOUTS`, one after the other in these ``world_size`` processes."""
    from megatron.core import parallel_state

    from bionemo.losses import ParallelGroups

    results: dict[str, Any] = {}
    runs = [*LAYOUTS.items(), *((f"{name}-unpadded", LAYOUTS[name]) for name in UNPADDED)]
    unpadded: list[int] | None = None
    for layout, tp in runs:
        if layout.endswith("-unpadded") and unpadded is None:
            unpadded = as_on_gpus()  # from here on (the padded layouts came first), as GPUs decide
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
        before = len(unpadded or [])
        results[layout] = {case: train(case, starts[case], ParallelGroups.current()) for case in CASES}
        results[layout]["unpadded"] = len(unpadded or []) - before
    return results
