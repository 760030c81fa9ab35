"""Worker functions for the pipeline-parallel tests (PP=2 over 2 gloo processes; importable by spawned processes).

Megatron's pipeline schedule cannot run on CPU (its p2p communication allocates on ``torch.cuda.current_device()``),
so the forward through the stages is done here as the schedule does it: the first stage's output tensor is sent
to the last stage, which takes it as its input tensor (``set_input_tensor``).
"""

import traceback
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bionemo.callbacks import PerplexityLoggingCallback
from bionemo.losses import MaskedTokenLossReduction, ParallelGroups
from support.parallel_workers import esm2_inputs, global_batch

TIMEOUT_MINUTES = 0.5
"""Megatron's process groups time out after this: a stage left waiting in a collective fails the test, not hangs."""

PREDICT = {"embeddings": True, "logits": True, "perplexity": False, "residues": True, "cls": True}
"""The prediction outputs compared (one forward of the unmasked sequence: what pipeline parallelism can predict)."""


def pp_esm2_config(pp: int):
    """A tiny ESM-2 (4 layers, hidden 32) for ``pp`` pipeline stages."""
    from bionemo.esm2.model import ESM2Config

    return ESM2Config(
        num_layers=4, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, seq_length=20,
        pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32,
        use_cpu_initialization=True,
    )  # fmt: skip


def build_stage(config) -> Any:
    """This rank's stage of the model.

    megatron-core 0.15.3 moves the last stage's copy of the tied word embeddings to CUDA before the all-reduce
    that makes it equal to the first stage's (``LanguageModule.setup_embeddings_and_output_layer``); on CPU the
    copy stays where it is.
    """
    with mock.patch.object(torch.Tensor, "cuda", lambda self, *args, **kwargs: self):
        return config.configure_model().eval()


def prediction_batch() -> dict[str, torch.Tensor]:
    """What :func:`bionemo.esm2.data.data_step` hands the predict step: 3 padded sequences of 12, 9 and 7 tokens."""
    tokens, valid = esm2_inputs()
    return {"tokens": tokens, "attention_mask": valid.long(), "padding": valid}


def _through_stages(step, model, batch) -> Any:
    """``step(model, batch)`` on each stage, the first stage's output sent to the last; the last's output."""
    from megatron.core import parallel_state

    group = parallel_state.get_pipeline_model_parallel_group()
    tokens = batch["tokens"]
    if parallel_state.is_pipeline_first_stage():
        model.set_input_tensor(None)
        hidden = step(model, batch)
        assert isinstance(hidden, torch.Tensor), f"a first stage must return a tensor to send; got {type(hidden)}"
        dist.send(hidden.contiguous(), dst=dist.get_global_rank(group, 1), group=group)
        return None
    hidden = torch.empty(tokens.shape[1], tokens.shape[0], model.config.hidden_size)
    dist.recv(hidden, src=dist.get_global_rank(group, 0), group=group)
    model.set_input_tensor(hidden)
    return step(model, batch)


def pp_weights_worker(rank: int, world_size: int, whole: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Load ``whole`` into this rank's stage, export it back, run the training and predict steps through both stages.

    Returns ``full_state_dict`` of the stage (every rank), the training step's logits and the predict step's
    outputs (last stage; ``None`` on the first), the traceback of a failing step (else ``None``), the refusal of a
    perplexity prediction (its message, else ``None``), and whether this rank writes predictions.
    """
    from megatron.core import parallel_state

    from bionemo.esm2.checkpoints.weights import apply_weights, full_state_dict
    from bionemo.esm2.model.steps import forward_step, make_predict_step

    parallel_state.initialize_model_parallel(
        pipeline_model_parallel_size=world_size, distributed_timeout_minutes=TIMEOUT_MINUTES
    )
    torch.manual_seed(rank + 1)  # each stage's own random start, replaced by the file's weights
    model = build_stage(pp_esm2_config(world_size))
    apply_weights(model, whole)
    full = full_state_dict(model)
    batch = prediction_batch()
    try:  # raises on every stage alike, before any communication
        make_predict_step(embeddings=True, logits=False, perplexity=True)(model, batch)
        refused = None
    except Exception as refusal:
        refused = f"{type(refusal).__name__}: {refusal}"
    logits = predicted = error = None
    try:  # a stage failing here leaves the other one waiting (until the peer exits): both report, the export stands
        with torch.no_grad():
            logits = _through_stages(forward_step, model, batch)
            predicted = _through_stages(make_predict_step(**PREDICT, num_layers=4), model, batch)
    except Exception:
        error = traceback.format_exc()
    return {
        "full": full,
        "logits": None if logits is None else logits["token_logits"],
        "predicted": predicted,
        "error": error,
        "refused": refused,
        "writes": ParallelGroups.current().holds_full_output(),
    }


class _Trainer:
    """The trainer attributes the validation callbacks read."""

    sanity_checking = False
    training = False
    validating = True


class _Module:
    """What the validation callbacks read of a ``BionemoLightningModule``: its reduction and its two logs."""

    def __init__(self) -> None:
        self.logged: dict[str, float] = {}
        self.device = torch.device("cpu")

    def validation_loss_reduction(self) -> MaskedTokenLossReduction:
        return MaskedTokenLossReduction(validation_step=True)

    def log(self, name: str, value: Any, **kwargs: Any) -> None:
        self.logged[name] = float(value)

    log_token_weighted = log


class _Step:
    def __init__(self, trainer: _Trainer, module: _Module) -> None:
        self.trainer, self.pl_module = trainer, module


def validation_steps() -> list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """Two validation steps of two micro-batches each: ``(logits [s, b, v], labels [b, s], loss_mask [b, s])``."""
    return [[global_batch(seed=10 * step + micro) for micro in range(2)] for step in range(2)]


def reference_val_loss() -> float:
    """Token-weighted mean cross-entropy over every micro-batch of :func:`validation_steps` (plain torch)."""
    total, count = 0.0, 0.0
    for micro_batches in validation_steps():
        for logits, labels, mask in micro_batches:
            per_token = F.cross_entropy(logits.permute(1, 2, 0), labels, reduction="none")  # [b, s]
            total += float((per_token * mask).sum())
            count += float(mask.sum())
    return total / count


def pp_validation_worker(rank: int, world_size: int) -> dict[str, Any]:
    """A validation epoch on two pipeline stages: only the last one sees micro-batch outputs, as under NeMo.

    Returns whether ``TokenWeightedValidationLoss`` was active while the steps ran and what each stage logged.
    """
    from megatron.core import parallel_state

    from bionemo.lightning.validation_loss import TokenWeightedValidationLoss

    parallel_state.initialize_model_parallel(
        pipeline_model_parallel_size=world_size, distributed_timeout_minutes=TIMEOUT_MINUTES
    )
    callbacks = [TokenWeightedValidationLoss(), PerplexityLoggingCallback()]
    trainer, module = _Trainer(), _Module()
    for callback in callbacks:
        callback.on_validation_epoch_start(trainer, module)  # type: ignore[arg-type]
    active = callbacks[0].active  # what the module reads to drop the per-step val_loss
    if parallel_state.is_pipeline_last_stage():
        reduction = module.validation_loss_reduction()
        for micro_batches in validation_steps():
            outputs = [
                reduction.forward({"labels": labels, "loss_mask": mask}, {"token_logits": logits})[2]
                for logits, labels, mask in micro_batches
            ]
            reduced = reduction.reduce(outputs)
            for callback in callbacks:
                callback.on_megatron_reduce_microbatches_end(_Step(trainer, module), outputs, reduction, reduced)  # type: ignore[arg-type]
    for callback in callbacks:
        callback.on_validation_epoch_end(trainer, module)  # type: ignore[arg-type]
    return {"active": active, "logged": module.logged}
