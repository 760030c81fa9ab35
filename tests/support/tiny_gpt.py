"""A tiny megatron-core GPT, its data and steps: a real model for the Lightning-layer tests.

The attention is :class:`bionemo.layers.SDPACoreAttention`, so the same model runs on CPU (gloo) and GPU.
The data is a learnable bigram pattern: x[t+1] = (5 * x[t] + 3) % vocab from a random start token.
"""

from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig
from torch.utils.data import Dataset

from bionemo.core import BionemoTrainableModelConfig, compute_device
from bionemo.layers import sdpa_layer_spec
from bionemo.lightning import BionemoLightningModule, MegatronOptimizerModule
from bionemo.losses import MaskedTokenLossReduction


@dataclass
class TinyGPTConfig(TransformerConfig, BionemoTrainableModelConfig[GPTModel, MaskedTokenLossReduction]):
    """A megatron TransformerConfig that builds a GPTModel with SDPA attention."""

    vocab_size: int = 32
    seq_length: int = 16
    num_layers: int = 2
    hidden_size: int = 32
    num_attention_heads: int = 4
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    masked_softmax_fusion: bool = False
    bias_activation_fusion: bool = False
    bias_dropout_fusion: bool = False
    gradient_accumulation_fusion: bool = False
    apply_rope_fusion: bool = False
    use_cpu_initialization: bool = True

    def configure_model(self, *args: Any, **kwargs: Any) -> GPTModel:
        return GPTModel(
            config=self,
            transformer_layer_spec=sdpa_layer_spec(),
            vocab_size=self.vocab_size,
            max_sequence_length=self.seq_length,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            share_embeddings_and_output_weights=True,
            position_embedding_type="learned_absolute",
        )

    def get_loss_reduction_class(self) -> type[MaskedTokenLossReduction]:
        return MaskedTokenLossReduction


class BigramDataset(Dataset):
    """Sequences following x[t+1] = (5 x[t] + 3) % vocab; each item carries its ``sample_index``."""

    def __init__(self, n: int, seq_length: int, vocab_size: int, seed: int, labels: bool = True) -> None:
        gen = torch.Generator().manual_seed(seed)
        seqs = torch.empty(n, seq_length + 1, dtype=torch.long)
        seqs[:, 0] = torch.randint(0, vocab_size, (n,), generator=gen)
        for t in range(seq_length):
            seqs[:, t + 1] = (5 * seqs[:, t] + 3) % vocab_size
        self.seqs = seqs
        self.labels = labels

    def __len__(self) -> int:
        return self.seqs.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = {"tokens": self.seqs[i, :-1], "sample_index": torch.tensor(i)}
        if self.labels:
            item["labels"] = self.seqs[i, 1:]
            item["loss_mask"] = torch.ones(self.seqs.shape[1] - 1)
        return item


def data_step(dataloader_iter) -> dict[str, torch.Tensor]:
    batch = next(dataloader_iter)
    return {k: v.to(compute_device(), non_blocking=True) for k, v in batch.items()}


def forward_step(model: GPTModel, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Training/validation batches (with labels) give vocab-parallel logits; predict batches gather the vocab."""
    tokens = batch["tokens"]
    position_ids = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    logits = model(tokens, position_ids, None, runtime_gather_output="labels" not in batch)  # [b, s, v]
    return {"token_logits": logits.transpose(0, 1)}  # [s, b, v]


def make_module(config: TinyGPTConfig | None = None, lr: float = 3e-3, **kwargs: Any) -> BionemoLightningModule:
    from megatron.core.optimizer import OptimizerConfig

    optimizer = MegatronOptimizerModule(
        config=OptimizerConfig(
            lr=lr, optimizer="adam", use_distributed_optimizer=torch.cuda.is_available(), weight_decay=0.0
        )
    )
    return BionemoLightningModule(
        config or TinyGPTConfig(), forward_step=forward_step, data_step=data_step, optimizer=optimizer, **kwargs
    )


class LossRecorder(pl.Callback):
    """Records ``reduced_train_loss`` after every training step."""

    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(trainer.callback_metrics["reduced_train_loss"]))
