"""The ESM-2-style encoder: megatron-core transformer layers with bidirectional SDPA attention."""

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from bionemo.core import BionemoTrainableModelConfig
from bionemo.lightning import install_compiled_rope, sdpa_layer_spec
from bionemo.losses import MaskedTokenLossReduction, token_cross_entropy

__all__ = ["ESM2Config", "forward_step", "make_predict_step"]


@dataclass
class ESM2Config(TransformerConfig, BionemoTrainableModelConfig[GPTModel, MaskedTokenLossReduction]):
    """A protein encoder: pre-LayerNorm transformer with padding (bidirectional) attention."""

    vocab_size: int = 26
    """Tokenizer vocabulary; the embedding table is padded to a multiple of 8."""
    seq_length: int = 130
    """Most tokens per sequence, ``<cls>`` and ``<eos>`` included."""
    num_layers: int = 4
    hidden_size: int = 64
    num_attention_heads: int = 4
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    masked_softmax_fusion: bool = False
    bias_activation_fusion: bool = False
    bias_dropout_fusion: bool = False
    gradient_accumulation_fusion: bool = False
    apply_rope_fusion: bool = False
    use_cpu_initialization: bool = True
    position_embedding: Literal["learned_absolute", "rope"] = "learned_absolute"
    """``"learned_absolute"`` (runs anywhere) or ``"rope"`` (ESM-2's rotary embeddings; megatron's needs CUDA)."""
    compile_rope: bool = False
    """With ``"rope"``: compile megatron's unfused RoPE into fused kernels (``install_compiled_rope``)."""

    @property
    def padded_vocab_size(self) -> int:
        """Embedding rows: the vocabulary rounded up to a multiple of 8 times the tensor-parallel size."""
        multiple = 8 * self.tensor_model_parallel_size
        return math.ceil(self.vocab_size / multiple) * multiple

    def configure_model(self, *args: Any, **kwargs: Any) -> GPTModel:
        """Build the encoder (megatron's GPTModel with a padding-mask, SDPA attention layer spec)."""
        if self.compile_rope and self.position_embedding == "rope":
            install_compiled_rope()
        return GPTModel(
            config=self,
            transformer_layer_spec=sdpa_layer_spec(AttnMaskType.padding),
            vocab_size=self.padded_vocab_size,
            max_sequence_length=self.seq_length,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            share_embeddings_and_output_weights=True,
            position_embedding_type=self.position_embedding,
        )

    def get_loss_reduction_class(self) -> type[MaskedTokenLossReduction]:
        """Masked-token cross-entropy."""
        return MaskedTokenLossReduction


def _run(model: GPTModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    tokens = batch["tokens"]
    position_ids = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    return model(tokens, position_ids, batch["padding_mask"])  # [b, s, v_local]


def forward_step(model: GPTModel, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Training / validation: ``{"token_logits": [s, b, v_local]}``."""
    return {"token_logits": _run(model, batch).transpose(0, 1)}


def make_predict_step(include_embeddings: bool, include_logits: bool, eos_id: int):
    """The prediction forward step: per-sequence masked-token loss sums, and optionally embeddings and logits.

    Outputs (``b`` sequences): ``loss_sum [b]`` and ``num_masked [b]`` (perplexity = exp(sum / count)),
    ``embeddings [b, h]`` (mean of the final hidden states over residues) and ``log_probs [b, s, v]``.
    """

    def predict_step(model: GPTModel, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        captured: dict[str, torch.Tensor] = {}

        def keep_hidden(_module: torch.nn.Module, _inputs: Any, output: torch.Tensor) -> None:
            captured["hidden"] = output

        handle = model.decoder.register_forward_hook(keep_hidden)
        try:
            logits = _run(model, batch).transpose(0, 1)  # [s, b, v_local]
        finally:
            handle.remove()
        groups = MaskedTokenLossReduction().groups
        per_token = token_cross_entropy(logits, batch["labels"], groups.tensor)  # [b, s]
        out = {"loss_sum": per_token.sum(dim=1), "num_masked": (batch["labels"] >= 0).sum(dim=1)}
        if include_embeddings:
            residues = batch["attention_mask"].clone()
            residues[:, 0] = False  # <cls>
            residues &= batch["tokens"] != eos_id
            hidden = captured["hidden"].transpose(0, 1).float()  # [b, s, h]
            weights = residues.unsqueeze(-1).float()
            out["embeddings"] = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)
        if include_logits:
            if groups.tensor_parallel_size() > 1:
                from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

                logits = gather_from_tensor_model_parallel_region(logits)
            log_probs = torch.log_softmax(logits.float(), dim=-1).transpose(0, 1)  # [b, s, v]
            out["log_probs"] = log_probs * batch["attention_mask"].unsqueeze(-1)  # padding positions hold 0
        return out

    return predict_step
