"""ESM-2 on megatron-core, computing what Hugging Face transformers' ``EsmForMaskedLM`` computes.

The math, layer by layer (``modeling_esm.py`` of transformers 4.57.6 is the reference the tests compare with):

- Embedding: word embeddings only (positions come from rotary embeddings). With ``token_dropout`` the rows of
  ``<mask>`` tokens are zeroed and every sequence is scaled by ``(1 - 0.15 * 0.8) / (1 - its <mask> ratio)``,
  in training and in evaluation alike; then multiplied by the attention mask (padding rows are zero).
- Pre-LayerNorm transformer layers (megatron-core's local layer spec with torch SDPA attention): rotary
  embeddings over the whole head dimension, non-interleaved halves, base 10000; softmax scale
  ``1 / sqrt(head_dim)``; exact (erf) GELU in the MLP; dropout as configured. The block is
  :class:`bionemo.layers.ResidualInGemmBlock` (megatron's ``TransformerBlock``; in half-precision GPU prediction its
  residual adds run inside the GEMMs, the same math).
- ``emb_layer_norm_after`` = megatron's final LayerNorm of the transformer block.
- LM head: dense -> exact GELU -> LayerNorm -> projection onto the (tied) word embeddings + its own bias.

The vocabulary (33 tokens) is padded inside the model to a multiple of ``8 x tensor parallel`` rows for
megatron's vocab-parallel layers; the padded logit columns are filled with a large negative number so that
softmax and cross-entropy see exactly the 33 real tokens, and :func:`vocab_logits` cuts them away.
"""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bionemo.core.megatron_env import prepare_megatron_import

prepare_megatron_import()  # before megatron-core's first import: it fails on machines with nvcc and no GPU

from megatron.core import parallel_state, tensor_parallel  # noqa: E402
from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding  # noqa: E402
from megatron.core.models.common.language_module.language_module import LanguageModule  # noqa: E402
from megatron.core.transformer.enums import AttnMaskType, ModelType  # noqa: E402
from megatron.core.transformer.module import MegatronModule  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from bionemo.core import BionemoTrainableModelConfig  # noqa: E402
from bionemo.esm2.catalog import ESM_DEFAULTS  # noqa: E402
from bionemo.esm2.hf.layout import MASK_TOKEN_ID, padded_vocab_size  # noqa: E402
from bionemo.layers import (  # noqa: E402
    ResidualInGemmBlock,
    UnpaddedSequences,
    chunk_length,
    context_parallel_group,
    gather_sequence,
    local_chunk,
    sdpa_layer_spec,
)
from bionemo.losses import MaskedTokenLossReduction  # noqa: E402

__all__ = [
    "MASK_RATIO_TRAIN",
    "AttentionMaps",
    "ESM2Config",
    "ESM2Model",
    "attention_probabilities",
    "padded_vocab_size",
    "vocab_logits",
]

MASK_RATIO_TRAIN = 0.15 * 0.8
"""The share of ``<mask>`` tokens ESM-2 was trained with (15% chosen, 80% of those masked): token dropout's scale."""

AttentionMaps = Callable[[int, int, torch.Tensor], None]
"""Receives attention probabilities: ``(layer, first_head, probabilities [b, heads, s, s])``, float32, for a run
of heads of one layer (``layer`` 0-based; ``first_head`` numbered over the whole model's heads of that layer)."""

_MAP_ELEMENTS = 2**27
"""Most elements of one chunk of attention probabilities (512 MiB in float32): heads are taken this many at a time."""


@dataclass
class ESM2Config(TransformerConfig, BionemoTrainableModelConfig["ESM2Model", MaskedTokenLossReduction]):
    """An ESM-2 model: megatron ``TransformerConfig`` fields plus the ESM-specific ones below.

    Defaults are ESM-2 8M's shape; ``bionemo.esm2.catalog.ESM2_SHAPES`` has the whole family.
    """

    vocab_size: int = ESM_DEFAULTS["vocab_size"]
    """Token ids (ESM-2's 33-token vocabulary); padded inside the model, never in its outputs."""
    seq_length: int = ESM_DEFAULTS["seq_length"]
    """Most tokens per sequence, ``<cls>`` and ``<eos>`` included (Hugging Face's ``max_position_embeddings``)."""
    num_layers: int = 6
    hidden_size: int = 320
    num_attention_heads: int = 20
    ffn_hidden_size: int | None = 1280
    layernorm_epsilon: float = ESM_DEFAULTS["layernorm_epsilon"]
    hidden_dropout: float = ESM_DEFAULTS["hidden_dropout"]
    attention_dropout: float = ESM_DEFAULTS["attention_dropout"]
    token_dropout: bool = ESM_DEFAULTS["token_dropout"]
    """ESM-2's token dropout: zero ``<mask>`` embeddings and rescale by the observed mask ratio."""
    mask_token_id: int = MASK_TOKEN_ID
    """Id of ``<mask>`` (token dropout looks for it)."""
    rotary_base: float = 10000.0
    """Base of the rotary embeddings' frequencies."""
    masked_softmax_fusion: bool = False
    bias_activation_fusion: bool = False
    bias_dropout_fusion: bool = False
    gradient_accumulation_fusion: bool = False
    apply_rope_fusion: bool = False
    use_cpu_initialization: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bias_activation_fusion:
            raise ValueError(
                "bias_activation_fusion=True: megatron's fused bias-GELU is the tanh approximation and ESM-2 uses "
                "the exact (erf) GELU; valid: False"
            )
        if self.activation_func is not F.gelu or self.gated_linear_unit:
            raise ValueError("ESM-2's MLP is dense -> exact GELU -> dense; activation_func must be F.gelu, no GLU")
        if self.apply_rope_fusion or self.rotary_interleaved:
            raise ValueError(
                "ESM-2's rotary embeddings are non-interleaved; apply_rope_fusion needs Transformer Engine "
                "(on GPUs RoPE is fused without it); valid: apply_rope_fusion=False, rotary_interleaved=False"
            )

    @property
    def padded_vocab_size(self) -> int:
        """Embedding rows: the vocabulary rounded up to a multiple of 8 times the tensor-parallel size."""
        return padded_vocab_size(self.vocab_size, self.tensor_model_parallel_size)

    def configure_model(self, *args: Any, **kwargs: Any) -> "ESM2Model":
        """Build the model for this rank's pipeline stage."""
        return ESM2Model(
            self,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
        )

    def get_loss_reduction_class(self) -> type[MaskedTokenLossReduction]:
        """Masked-token cross-entropy."""
        return MaskedTokenLossReduction


class ESM2Embedding(LanguageModelEmbedding):
    """Word embeddings with ESM-2's token dropout and attention-mask zeroing; returns ``[s, b, h]``."""

    def __init__(self, config: ESM2Config, vocab_size: int) -> None:
        super().__init__(
            config=config,
            vocab_size=vocab_size,
            max_sequence_length=config.seq_length,
            position_embedding_type="none",
        )
        self.token_dropout = config.token_dropout
        self.mask_token_id = config.mask_token_id

    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, unpadded: UnpaddedSequences | None = None
    ) -> torch.Tensor:
        """``input_ids [b, s]``, ``attention_mask [b, s]`` (True on real tokens, or None: no padding).

        With ``unpadded``, ``input_ids`` is ``[1, T]``: the sequences concatenated (token dropout per sequence).
        """
        embeddings = self.word_embeddings(input_ids)  # [b, s, h]
        if self.token_dropout:
            is_mask = input_ids == self.mask_token_id
            embeddings = embeddings.masked_fill(is_mask.unsqueeze(-1), 0.0)
            if unpadded is not None:
                ids, bounds = unpadded.sequence_ids, unpadded.boundaries
                if ids is None or bounds is None:
                    raise ValueError("UnpaddedSequences needs sequence_ids and boundaries for token dropout")
                masked = torch.zeros(len(bounds) - 1, device=ids.device).index_add_(0, ids, is_mask[0].float())
                observed = (masked / bounds.diff())[ids][None, :]  # [1, T]
            else:
                lengths = attention_mask.sum(-1) if attention_mask is not None else input_ids.shape[1]
                observed = (is_mask.sum(-1).float() / lengths)[:, None]  # [b, 1]
            embeddings = (embeddings * (1 - MASK_RATIO_TRAIN) / (1 - observed)[..., None]).to(embeddings.dtype)
        if attention_mask is not None:
            embeddings = (embeddings * attention_mask.unsqueeze(-1)).to(embeddings.dtype)
        embeddings = embeddings.transpose(0, 1).contiguous()
        if self.config.fp32_residual_connection:
            embeddings = embeddings.float()
        return self.embedding_dropout(embeddings)


class ESM2RotaryEmbedding(torch.nn.Module):
    """Rotary frequencies ``[s, 1, 1, head_dim]`` (non-interleaved) for megatron's RoPE, on any device.

    megatron-core 0.15.3's ``RotaryEmbedding`` moves its frequencies to ``torch.cuda.current_device()`` on every
    first call; this one computes them in fp32 on the device of the hidden states, CPU included.
    """

    def __init__(self, head_dim: int, base: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self._cached: tuple[tuple[int, torch.device], torch.Tensor] | None = None

    def forward(self, seq_len: int, device: torch.device) -> torch.Tensor:
        """Angles ``position * inv_freq`` for positions ``0 .. seq_len - 1``, both halves."""
        key = (seq_len, device)
        if self._cached is None or self._cached[0] != key:
            exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
            inv_freq = 1.0 / (self.base**exponents)
            freqs = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
            self._cached = (key, torch.cat((freqs, freqs), dim=-1)[:, None, None, :])
        return self._cached[1]


class ESM2LMHead(MegatronModule):
    """``dense -> GELU -> LayerNorm`` before the projection onto the vocabulary (replicated across TP ranks)."""

    def __init__(self, config: ESM2Config) -> None:
        super().__init__(config=config)
        device = "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
        h = config.hidden_size
        self.dense = torch.nn.Linear(h, h, device=device, dtype=config.params_dtype)
        self.layer_norm = torch.nn.LayerNorm(h, eps=config.layernorm_epsilon, device=device, dtype=config.params_dtype)
        if config.perform_initialization and config.init_method is not None:
            config.init_method(self.dense.weight)
            torch.nn.init.zeros_(self.dense.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[s, b, h] -> [s, b, h]``."""
        return self.layer_norm(F.gelu(self.dense(hidden)))


class ESM2Model(LanguageModule):
    """ESM-2 masked language model on megatron-core (tensor, pipeline and context parallel).

    ``forward(input_ids [b, s], attention_mask [b, s] | None)`` returns logits ``[s, b, v_local]``: sequence
    first, the vocabulary split over tensor-parallel ranks and padded (see :func:`vocab_logits`). With
    ``output_hidden=True`` it returns ``(logits, hidden [s, b, h])``, the hidden states after the final
    LayerNorm (Hugging Face's ``last_hidden_state``). Stages before the last return the hidden states.
    ``transformer_layer_spec`` defaults to megatron's local layer spec with torch SDPA attention (padding mask).
    ``lm_head=False`` builds the encoder alone (no LM head, no output layer: fine-tuned models put their own head on
    the hidden states), which only runs with ``output_logits=False``.
    """

    def __init__(
        self,
        config: ESM2Config,
        pre_process: bool = True,
        post_process: bool = True,
        parallel_output: bool = True,
        transformer_layer_spec: ModuleSpec | None = None,
        lm_head: bool = True,
    ) -> None:
        super().__init__(config=config)
        if config.sequence_parallel:
            raise ValueError("ESM2Model supports tensor, pipeline and context parallelism; sequence parallel: not yet")
        self.config: ESM2Config = config
        self.pre_process = pre_process
        self.post_process = post_process
        self.parallel_output = parallel_output
        self.vocab_size = config.vocab_size
        self.padded_vocab_size = config.padded_vocab_size
        self.share_embeddings_and_output_weights = lm_head
        self.model_type = ModelType.encoder_or_decoder
        if pre_process:
            self.embedding = ESM2Embedding(config, self.padded_vocab_size)
        self.rotary_pos_emb = ESM2RotaryEmbedding(
            config.kv_channels or config.hidden_size // config.num_attention_heads, config.rotary_base
        )
        self.decoder = ResidualInGemmBlock(
            config=config,
            spec=sdpa_layer_spec(AttnMaskType.padding),
            pre_process=pre_process,
            post_process=post_process,
        )
        self.has_lm_head = post_process and lm_head
        if self.has_lm_head:
            self.lm_head = ESM2LMHead(config)
            self.output_layer = tensor_parallel.ColumnParallelLinear(
                config.hidden_size,
                self.padded_vocab_size,
                config=config,
                init_method=config.init_method,  # type: ignore[arg-type]  # set by TransformerConfig.__post_init__
                bias=True,
                skip_bias_add=False,
                gather_output=not parallel_output,
                skip_weight_param_allocation=pre_process,
            )
        if not lm_head:
            if pre_process:  # what setup_embeddings_and_output_layer marks; nothing is tied without an output layer
                setattr(self.embedding.word_embeddings.weight, "is_embedding_or_output_parameter", True)  # noqa: B010
        elif pre_process or post_process:
            self.setup_embeddings_and_output_layer()

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> Any:
        """Megatron's sharded state dict; without an LM head the output layer's tying and padding do not apply."""
        if self.has_lm_head or not self.post_process:
            return super().sharded_state_dict(prefix, sharded_offsets, metadata)
        return MegatronModule.sharded_state_dict(self, prefix, sharded_offsets, metadata)

    def set_input_tensor(self, input_tensor: torch.Tensor | list[torch.Tensor]) -> None:
        """The previous pipeline stage's output (megatron's pipeline schedules call this)."""
        if isinstance(input_tensor, list):
            (input_tensor,) = input_tensor
        self.decoder.set_input_tensor(input_tensor)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        output_hidden: bool = False,
        hidden_layers: Sequence[int] = (),
        unpadded: UnpaddedSequences | None = None,
        output_logits: bool = True,
        gather_context: bool = True,
        attention_maps: AttentionMaps | None = None,
    ) -> Any:
        """See the class docstring; ``attention_mask`` is True on real tokens (None: no padding).

        ``hidden_layers`` (absolute: 0 = the embedding output, ``num_layers`` = after the final LayerNorm, as in
        Hugging Face's ``hidden_states``) adds a third output, ``{K: hidden [s, b, h]}``; whole model only (no
        pipeline parallelism). ``unpadded``: ``input_ids [1, T]`` holds the sequences concatenated (no
        ``attention_mask``; ``positions`` and ``sequence_ids`` set) and every output is ``[T, 1, ...]``.
        ``output_logits=False`` skips the LM head (the logits output is None).

        Context parallelism (``context_parallel_size > 1``, padded batches): every rank embeds the whole batch and
        runs the layers on its chunk of the sequence (:mod:`bionemo.layers.context_parallel`). Outputs are
        gathered to the whole sequence, or with ``gather_context=False`` are this rank's chunk
        (``[ceil(s / cp), b, ...]``, zero-padded past the end): training takes the loss of each rank's chunk.

        ``attention_maps`` is given every layer's attention probabilities (:data:`AttentionMaps`), computed
        explicitly from the query and key that reach the attention kernel (:func:`attention_probabilities`),
        which itself runs as without it; padded batches of a whole model without context parallelism only.
        """
        group = self._context_group(unpadded)
        captured: dict[int, torch.Tensor] = {}
        handles = [self._capture(k, captured) for k in hidden_layers if k != self.config.num_layers]
        try:
            if attention_maps is not None:
                handles += self._watch_attention(attention_maps, unpadded, group)
            hidden = self.embedding(input_ids, attention_mask, unpadded) if self.pre_process else None
            padding_mask, rotary = self._mask_and_rotary(input_ids, attention_mask, unpadded, group)
            if group is not None and hidden is not None:
                hidden = local_chunk(hidden, 0, group)
            hidden = self.decoder(
                hidden_states=hidden, attention_mask=padding_mask, rotary_pos_emb=rotary, packed_seq_params=unpadded
            )
        finally:
            for handle in handles:
                handle.remove()
        if not self.post_process:
            return hidden
        if group is not None:
            hidden, captured = self._context_outputs(hidden, captured, input_ids.shape[1], group, gather_context)
        logits = None
        if output_logits:
            if not self.has_lm_head:
                raise ValueError("this ESM2Model was built without its language-model head (lm_head=False): no logits")
            logits, _ = self.output_layer(self.lm_head(hidden), weight=self.shared_embedding_or_output_weight())
            logits = self._hide_vocab_padding(logits)
        if hidden_layers:
            return logits, hidden, {k: hidden if k == self.config.num_layers else captured[k] for k in hidden_layers}
        return (logits, hidden) if output_hidden else logits

    def _context_group(self, unpadded: UnpaddedSequences | None) -> Any:
        """The context-parallel group (None without context parallelism)."""
        if self.config.context_parallel_size == 1:
            return None
        if unpadded is not None:
            raise ValueError("unpadded sequences: context_parallel_size 1 only")
        group = context_parallel_group()
        if group is None:
            raise RuntimeError("context_parallel_size > 1 but megatron's context-parallel group is not initialized")
        return group

    def _mask_and_rotary(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        unpadded: UnpaddedSequences | None,
        group: Any,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Megatron's padding mask (True = not attended) over every key, and the rotary angles of the queries."""
        device = input_ids.device
        if unpadded is not None:
            if attention_mask is not None or unpadded.positions is None:
                raise ValueError("unpadded sequences take no attention_mask and need their token positions")
            return None, self.rotary_pos_emb(unpadded.longest, device)[:, 0][unpadded.positions]  # [T, 1, d]
        length = input_ids.shape[1]
        if group is None:
            mask = None if attention_mask is None else ~attention_mask.bool()[:, None, None, :]
            return mask, self.rotary_pos_emb(length, device)
        padded = chunk_length(length, group) * torch.distributed.get_world_size(group)
        mask = None
        if attention_mask is not None or padded != length:
            real = attention_mask.bool() if attention_mask is not None else input_ids.new_ones(input_ids.shape).bool()
            mask = ~F.pad(real, (0, padded - length), value=False)[:, None, None, :]
        return mask, local_chunk(self.rotary_pos_emb(padded, device), 0, group)

    def _context_outputs(
        self, hidden: torch.Tensor, captured: dict[int, torch.Tensor], length: int, group: Any, gather: bool
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Context-parallel outputs: the whole sequence (``gather``) or this rank's chunk, for every layer alike."""
        if not gather:  # the embedding output (layer 0) covers the whole sequence
            return hidden, {k: local_chunk(v, 0, group) if k == 0 else v for k, v in captured.items()}
        return gather_sequence(hidden, group)[:length], {
            k: v if k == 0 else gather_sequence(v, group)[:length] for k, v in captured.items()
        }

    def _capture(self, layer: int, into: dict[int, torch.Tensor]) -> torch.utils.hooks.RemovableHandle:
        """A forward hook keeping the output of ``layer`` (0: the embedding) in ``into[layer]``."""
        if not (self.pre_process and self.post_process) or not 0 <= layer <= self.config.num_layers:
            raise ValueError(
                f"hidden layer {layer}: valid are 0..{self.config.num_layers} of a whole model (no pipeline stages)"
            )
        module = self.embedding if layer == 0 else self.decoder.layers[layer - 1]

        def keep(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            into[layer] = output[0] if isinstance(output, tuple) else output

        return module.register_forward_hook(keep)

    def _watch_attention(
        self, receive: AttentionMaps, unpadded: UnpaddedSequences | None, group: Any
    ) -> list[torch.utils.hooks.RemovableHandle]:
        """Forward pre-hooks on every layer's core attention passing its probabilities to ``receive``."""
        if unpadded is not None or group is not None or not (self.pre_process and self.post_process):
            raise ValueError(
                "attention maps: padded batches of a whole model (no pipeline stages, context_parallel_size 1) only"
            )
        tp = parallel_state.get_tensor_model_parallel_rank() if parallel_state.model_parallel_is_initialized() else 0

        def watch(layer: int, core: Any) -> torch.utils.hooks.RemovableHandle:
            scale = getattr(core, "softmax_scale", None)

            def hook(_module: torch.nn.Module, args: tuple[Any, ...]) -> None:
                query, key, _value, mask = args[:4]  # megatron's Attention passes them positionally
                first = tp * query.shape[2]  # this tensor-parallel rank's heads
                for start, probabilities in attention_probabilities(query, key, mask, scale):
                    receive(layer, first + start, probabilities)

            return core.register_forward_pre_hook(hook)

        layers: Any = self.decoder.layers
        return [watch(i, layer.self_attention.core_attention) for i, layer in enumerate(layers)]

    def _hide_vocab_padding(self, logits: torch.Tensor) -> torch.Tensor:
        if self.padded_vocab_size == self.vocab_size:
            return logits
        local = logits.shape[-1]
        start = 0 if local == self.padded_vocab_size else parallel_state.get_tensor_model_parallel_rank() * local
        padding = torch.arange(start, start + local, device=logits.device) >= self.vocab_size
        return logits.masked_fill(padding, torch.finfo(logits.dtype).min / 2)


def attention_probabilities(
    query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scale: float | None = None
) -> Iterator[tuple[int, torch.Tensor]]:
    """``softmax(q k^T * scale)`` over the keys ``mask`` leaves, in float32, a run of heads at a time.

    The math path, never a fused kernel (those do not return the probabilities). ``query`` / ``key``
    ``[s, b, heads, d]`` as megatron's attention gives its core attention; ``mask`` megatron's, True where a key
    is not attended (``[b, 1, 1, s]``), or None; ``scale`` defaults to ``1 / sqrt(d)``. Yields
    ``(first_head, probabilities [b, heads_chunk, s, s])``, each chunk at most :data:`_MAP_ELEMENTS` elements.
    """
    seq, batch, heads, head_dim = query.shape
    factor = head_dim**-0.5 if scale is None else scale
    chunk = max(1, _MAP_ELEMENTS // max(1, batch * seq * key.shape[0]))
    for start in range(0, heads, chunk):
        q = query[:, :, start : start + chunk].permute(1, 2, 0, 3).float() * factor  # [b, c, s, d]
        k = key[:, :, start : start + chunk].permute(1, 2, 3, 0).float()  # [b, c, d, s]
        scores = torch.matmul(q, k)
        if mask is not None:
            scores.masked_fill_(mask, torch.finfo(scores.dtype).min)
        yield start, scores.softmax(dim=-1)


def vocab_logits(logits: torch.Tensor, vocab_size: int = 33) -> torch.Tensor:
    """Whole-vocabulary logits ``[s, b, vocab_size]`` from :class:`ESM2Model`'s ``[s, b, v_local]``.

    Gathers the tensor-parallel slices (a collective: every rank of the group calls it) and drops the padding.
    """
    if parallel_state.model_parallel_is_initialized() and parallel_state.get_tensor_model_parallel_world_size() > 1:
        logits = tensor_parallel.gather_from_tensor_model_parallel_region(logits)
    return logits[..., :vocab_size]
