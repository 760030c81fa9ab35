"""One optimizer step of the tiny GPT under nemo's MegatronStrategy on two very unevenly masked micro-batches.

Usage: python tests/support/token_weighted_step.py OUT_DIR

One GPU, fp32 (no TF32), dropout 0, megatron's local (non-distributed) optimizer; a global batch of 2 sequences
with micro-batch size 1, so one step accumulates the gradients of 2 micro-batches, whose loss masks cover
``MASKED_TOKENS`` = 3 and 60 tokens. Writes OUT_DIR/step.pt (rank 0) with what the step saw and made:

- ``micro_batches``: each micro-batch as the model received it (``tokens``, ``labels``, ``loss_mask``; ``[1, s]``);
- ``loss_sums``: each micro-batch's ``[loss_sum, num_tokens]`` from :class:`bionemo.losses.MaskedTokenLossReduction`;
- ``reduced_loss``: the step's reduced loss; ``num_microbatches``: megatron's micro-batches per step;
- ``weights`` / ``grads``: every parameter of the unwrapped ``GPTModel`` and its gradient, both read in
  ``on_before_optimizer_step``: after megatron's forward-backward schedule and ``finalize_model_grads`` (which
  divides by the step's token count when ``calculate_per_token_loss`` is set), before the optimizer changes the
  weights. Megatron's DDP accumulates gradients into ``param.main_grad`` (its contiguous grad buffer) and leaves
  ``param.grad`` empty; its fp32 optimizer copies ``main_grad`` into ``grad`` only inside ``step()``.
- ``per_token_loss``: the model config's ``calculate_per_token_loss`` during the step.

The test recomputes the gradients in plain PyTorch (:func:`reference_gradients`) from ``weights`` and
``micro_batches``. nemo and megatron are imported only inside :func:`main` and :func:`tiny_config`.
"""

import argparse
import sys
import traceback
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from typing_extensions import override

from bionemo.losses import LOSS_SUM_KEY

SEQ, VOCAB = 64, 64
MASKED_TOKENS = (3, 60)
"""Loss-mask token counts of the step's two micro-batches, in the order the step takes them."""


class Objective(StrEnum):
    """How a step's micro-batch losses combine into the loss whose gradient the step takes."""

    TOKEN_MEAN = "token_mean"
    """Sum of the masked token cross-entropies of all micro-batches / all masked tokens of the step."""
    MEAN_OF_MEANS = "mean_of_means"
    """Mean over micro-batches of each micro-batch's masked-token mean (megatron without calculate_per_token_loss)."""


class UnevenMaskDataset(Dataset):
    """Random tokens and labels; item ``i`` has a loss mask of ``masked_tokens[i]`` ones at random positions."""

    def __init__(self, masked_tokens: Sequence[int] = MASKED_TOKENS, seq_length: int = SEQ, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        n = len(masked_tokens)
        self.tokens = torch.randint(0, VOCAB, (n, seq_length), generator=gen)
        self.labels = torch.randint(0, VOCAB, (n, seq_length), generator=gen)
        self.loss_mask = torch.zeros(n, seq_length)
        for i, count in enumerate(masked_tokens):
            self.loss_mask[i, torch.randperm(seq_length, generator=gen)[:count]] = 1.0

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"tokens": self.tokens[i], "labels": self.labels[i], "loss_mask": self.loss_mask[i]}


def tiny_config() -> Any:
    """The config of the tiny GPT that both the step and the reference build (``configure_model()`` needs megatron's
    parallel state)."""
    from support.tiny_gpt import TinyGPTConfig

    return TinyGPTConfig(
        vocab_size=VOCAB,
        seq_length=SEQ,
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
    )


def reference_gradients(
    model: torch.nn.Module, micro_batches: Sequence[Mapping[str, torch.Tensor]], objective: Objective
) -> tuple[dict[str, torch.Tensor], float]:
    """Gradient of ``objective`` over ``micro_batches`` for every named parameter of ``model``, in plain PyTorch.

    Args:
        model: A megatron ``GPTModel`` (``model(tokens, position_ids, None)`` gives logits ``[b, s, v]``).
        micro_batches: Each with ``tokens``, ``labels`` and ``loss_mask``, all ``[b, s]``, on ``model``'s device.
        objective: How the micro-batches' masked token cross-entropies combine (see :class:`Objective`).

    Returns:
        ``({name: gradient}, loss)``; ``model``'s own ``.grad`` fields are left untouched.
    """
    sums, counts = [], []
    for batch in micro_batches:
        tokens = batch["tokens"]
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        logits = model(tokens, positions, None)  # [b, s, v]
        per_token = F.cross_entropy(logits.float().transpose(1, 2), batch["labels"], reduction="none")  # [b, s]
        mask = batch["loss_mask"].to(torch.float32)
        sums.append((per_token * mask).sum())
        counts.append(mask.sum())
    if objective is Objective.TOKEN_MEAN:
        loss = torch.stack(sums).sum() / torch.stack(counts).sum()
    else:
        loss = torch.stack([s / c for s, c in zip(sums, counts, strict=True)]).mean()
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named])
    return {name: g.detach() for (name, _), g in zip(named, grads, strict=True)}, float(loss)


class StepCapture(pl.Callback):
    """Records the training step's micro-batches, their loss sums, and the weights and gradients it made."""

    def __init__(self) -> None:
        self.record: dict[str, Any] = {"micro_batches": [], "loss_sums": []}

    def on_megatron_microbatch_end(self, step: Any, batch: Any, output: Any, forward_callback: Any) -> None:
        if not step.forward_only:
            self.record["micro_batches"].append({k: v.detach().cpu().clone() for k, v in batch.items()})

    def on_megatron_reduce_microbatches_end(self, step: Any, microbatch_outputs: Any, reduced: Any) -> None:
        if step.forward_only:
            return
        self.record["loss_sums"] = [out[LOSS_SUM_KEY].detach().cpu().clone() for out in microbatch_outputs]
        self.record["reduced_loss"] = float(reduced)
        self.record["num_microbatches"] = int(step.num_microbatches)

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: Any, optimizer: Any) -> None:
        model = pl_module.unwrapped_module()  # the GPTModel inside megatron's DDP
        self.record["per_token_loss"] = bool(model.config.calculate_per_token_loss)
        weights, grads, missing = {}, {}, []
        for name, param in model.named_parameters():
            weights[name] = param.detach().float().cpu().clone()
            grad = getattr(param, "main_grad", None)
            if grad is None:
                missing.append(name)
            else:
                grads[name] = grad.detach().float().cpu().clone()
        self.record.update(weights=weights, grads=grads, params_without_main_grad=missing)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)

    from megatron.core.optimizer import OptimizerConfig

    from bionemo.lightning import BionemoLightningModule, MegatronDataModule, MegatronOptimizerModule
    from support.tiny_gpt import data_step, forward_step
    from support.trainers import megatron_trainer

    torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32 matrix products, comparable with the reference
    torch.backends.cudnn.allow_tf32 = False

    torch.manual_seed(0)
    optimizer = MegatronOptimizerModule(
        config=OptimizerConfig(
            lr=1e-3,
            optimizer="adam",
            use_distributed_optimizer=False,
            bf16=False,
            fp16=False,
            params_dtype=torch.float32,
            weight_decay=0.0,
            clip_grad=0.0,
        )
    )
    module = BionemoLightningModule(tiny_config(), forward_step=forward_step, data_step=data_step, optimizer=optimizer)
    dataset = UnevenMaskDataset(MASKED_TOKENS * 2)  # two steps' worth, so the one step never runs the data dry
    datamodule = MegatronDataModule(
        train=dataset, val=dataset, micro_batch_size=1, global_batch_size=2, seq_length=SEQ, num_workers=0
    )
    capture = StepCapture()
    trainer = megatron_trainer("32", [capture], max_steps=1, limit_val_batches=0)
    try:
        trainer.fit(module, datamodule=datamodule)
        capture.record["global_step"] = trainer.global_step
    except Exception:  # recorded for the test to report
        capture.record["error"] = traceback.format_exc()[-6000:]
    if trainer.global_rank == 0:
        torch.save(capture.record, args.out_dir / "step.pt")
    sys.exit(1 if "error" in capture.record else 0)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bionemo.core.megatron_env import prepare_megatron_import

    prepare_megatron_import()
    main()
