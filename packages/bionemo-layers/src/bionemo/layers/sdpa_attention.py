"""A megatron-core core-attention module that calls torch's ``scaled_dot_product_attention``.

Put it into a layer spec (``spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention``)
to run megatron-core transformer layers without Transformer Engine: on CPU (megatron's own
``DotProductAttention`` needs CUDA) and on GPUs, where torch dispatches to its fused flash / memory-efficient
kernels instead of megatron's unfused local attention.

Unpadded ("thd") batches: pass :class:`UnpaddedSequences` as megatron's ``packed_seq_params`` and the
sequences concatenated as ``[T, 1, hidden]``. On CUDA in fp16/bf16 they run on torch's variable-length flash
attention (no padding, no mask, no layout copies); elsewhere on SDPA with a block-diagonal mask (the same maths,
``T x T`` memory: for tests and small inputs). Without gradients (prediction) that is the flash kernel itself,
``torch.ops.aten._flash_attention_forward``, the call ``torch.nn.attention.varlen.varlen_attn`` makes for it in
torch 2.11; with gradients (training) ``varlen_attn``, imported on first use. Importing ``torch.nn.attention.varlen``
imports TorchDynamo (its ``torch.compiler.assume_constant_result`` decorations): about half a second of a
prediction's start-up on the CPU machine that the prediction path no longer pays
(docs/benchmarks.md#prediction-start-up).
"""

import contextlib
import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from torch.nn.attention import SDPBackend, sdpa_kernel

from bionemo.layers._triton import triton_importable

__all__ = ["SDPACoreAttention", "UnpaddedSequences", "sdpa_layer_spec", "varlen_attention_available"]

VARLEN_MODULE = "torch.nn.attention.varlen"
"""torch's variable-length attention (torch >= 2.9), imported only where a gradient needs it."""

_CAUSAL_MASK_TYPES = frozenset({AttnMaskType.causal, AttnMaskType.padding_causal, AttnMaskType.causal_bottom_right})
"""megatron's mask types under which a query attends to no later key (``causal_bottom_right``: aligned to the
last key when there are more keys than queries; the others to the first)."""

MASKED_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""SDPA kernels for masked (padded) batches on CUDA: not cuDNN's. torch 2.11 picks cuDNN attention for masked
bf16 inputs on an H200 and plans it anew for every new shape, as length-sorted prediction batches all are: the
planning takes longer per layer call than the memory-efficient kernel takes to run
(docs/benchmarks.md#prediction-loop)."""


def _on_cuda(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda


def _scores_mask(
    mask_type: AttnMaskType,
    attention_mask: torch.Tensor | None,
    attention_bias: torch.Tensor | None,
    queries: int,
    keys: int,
    device: torch.device,
) -> tuple[torch.Tensor | None, bool]:
    """SDPA's ``attn_mask`` (boolean, ``True`` = attend; or the float bias with ``-inf`` where not) and ``is_causal``.

    Causality stays SDPA's ``is_causal`` only when nothing else is masked or added (its fast path); otherwise the
    lower-triangular ``[queries, keys]`` mask joins megatron's ``attention_mask`` and the bias.
    """
    allowed = None if attention_mask is None else ~attention_mask.bool()
    causal = mask_type in _CAUSAL_MASK_TYPES
    bottom_right = mask_type == AttnMaskType.causal_bottom_right and keys != queries
    if causal and (allowed is not None or attention_bias is not None or bottom_right):
        diagonal = keys - queries if bottom_right else 0
        lower = torch.ones(queries, keys, dtype=torch.bool, device=device).tril(diagonal=diagonal)
        allowed = lower if allowed is None else allowed & lower
        causal = False
    if attention_bias is None:
        return allowed, causal
    if allowed is None:
        return attention_bias, causal
    return torch.where(allowed, attention_bias, float("-inf")), causal


@functools.cache
def _has_varlen() -> bool:
    """Whether this torch has :data:`VARLEN_MODULE` (found without importing it)."""
    return importlib.util.find_spec(VARLEN_MODULE) is not None


def varlen_attention_available(dtype: torch.dtype) -> bool:
    """Whether :class:`UnpaddedSequences` run on a variable-length flash kernel here (CUDA, fp16 / bf16)."""
    return _has_varlen() and torch.cuda.is_available() and dtype in (torch.float16, torch.bfloat16)


def varlen_flash_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: torch.Tensor, longest: int, scale: float | None
) -> torch.Tensor:
    """Bidirectional attention of ``[T, heads, head_dim]`` sequences cut at ``bounds`` (int32 ``[n + 1]``).

    With a gradient to record, ``torch.nn.attention.varlen.varlen_attn`` (its backward); without, the same flash
    forward kernel called directly, which imports nothing (see the module).
    """
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        from torch.nn.attention.varlen import varlen_attn

        return varlen_attn(query, key, value, bounds, bounds, longest, longest, scale=scale)  # pyright: ignore[reportReturnType]
    return torch.ops.aten._flash_attention_forward(
        query, key, value, bounds, bounds, longest, longest, 0.0, False, False, scale=scale
    )[0]


@dataclass
class UnpaddedSequences(PackedSeqParams):
    """Sequences concatenated without padding (megatron's ``thd`` format), for :class:`SDPACoreAttention`.

    ``cu_seqlens_q`` / ``cu_seqlens_kv`` stay None so that megatron applies rotary embeddings token by token
    (give them per token, ``[T, 1, head_dim]``) instead of its Python loop over sequences; the boundaries are
    ``boundaries`` (int32 ``[n + 1]``, on the device), ``longest`` (host int), ``sequence_ids`` (``[T]``,
    which sequence each token belongs to) and ``positions`` (``[T]``, each token's position in its sequence).
    """

    boundaries: torch.Tensor | None = None
    longest: int = 0
    sequence_ids: torch.Tensor | None = None
    positions: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.qkv_format = "thd"


FUSED_ROTARY_SWITCH = "BIONEMO_FUSED_ROTARY_ATTENTION"
"""Set to ``0`` to keep RoPE and attention apart in GPU prediction (:meth:`SDPACoreAttention.attends_rotated`)."""


def fused_rotary_attention_available(query: torch.Tensor) -> bool:
    """Whether the Triton kernel that rotates and attends in one pass can run on ``query``: CUDA, fp16 / bf16."""
    return (
        query.is_cuda
        and query.dtype in (torch.float16, torch.bfloat16)
        and os.environ.get(FUSED_ROTARY_SWITCH, "1") != "0"
        and triton_importable()
    )


class SDPACoreAttention(MegatronModule):
    """Core attention (softmax(QK^T / sqrt(d)) V) through ``torch.nn.functional.scaled_dot_product_attention``.

    Takes megatron's ``[s, b, heads, head_dim]`` query/key/value (heads local to this tensor-parallel rank;
    fewer key/value heads for grouped-query attention) and returns ``[s, b, heads * head_dim]``.
    ``attention_mask`` follows megatron: boolean, ``True`` where attention is *not* allowed, broadcastable to
    ``[b, heads, s_q, s_k]``; ``attention_bias`` (float, broadcastable to the same) is added to the scaled scores.
    Causal masking comes from ``attn_mask_type`` (``causal``, ``padding_causal``, ``causal_bottom_right``) and
    applies together with both: softmax(QK^T / sqrt(d) + bias) V over the keys neither masks out.

    Context parallelism (bidirectional attention only): query, key and value hold this rank's chunk of the
    sequence (:mod:`bionemo.layers.context_parallel`); keys and values of the whole sequence are gathered
    and ``attention_mask`` covers the whole (padded) sequence of keys.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size > 1 and attn_mask_type in _CAUSAL_MASK_TYPES:
            raise ValueError(
                f"SDPACoreAttention supports context_parallel_size={config.context_parallel_size} for bidirectional "
                "attention only (attn_mask_type padding or no_mask); causal models: use Transformer Engine attention"
            )
        self.context_parallel = config.context_parallel_size > 1
        self.attn_mask_type = attn_mask_type
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_scale = softmax_scale

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        """Attend ``query`` over ``key``/``value``; see the class docstring for shapes and the mask."""
        if isinstance(packed_seq_params, UnpaddedSequences):
            return self._attend_unpadded(query, key, value, packed_seq_params)
        if packed_seq_params is not None:
            raise ValueError("SDPACoreAttention takes packed sequences as UnpaddedSequences only (packed_seq_params)")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if self.context_parallel:
            key, value = self._whole_sequence(key, value)
        seq, batch, heads, head_dim = query.shape
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
        mask, causal = _scores_mask(mask_type, attention_mask, attention_bias, q.shape[2], k.shape[2], q.device)
        dropout = self.dropout_p if self.training else 0.0
        kernels = sdpa_kernel(MASKED_BACKENDS) if mask is not None and query.is_cuda else contextlib.nullcontext()
        with self._dropout_rng(query, dropout), kernels:
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=dropout,
                is_causal=causal,
                scale=self.softmax_scale,
                enable_gqa=k.shape[1] != heads,
            )
        return out.permute(2, 0, 1, 3).reshape(seq, batch, heads * head_dim)

    def _whole_sequence(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of every context-parallel rank's chunk, in sequence order."""
        from bionemo.layers.context_parallel import context_parallel_group, gather_keys

        group = context_parallel_group()
        if group is None:
            raise RuntimeError("context_parallel_size > 1 but megatron's context-parallel group is not initialized")
        return gather_keys(key, group), gather_keys(value, group)

    def _dropout_rng(self, query: torch.Tensor, dropout: float) -> contextlib.AbstractContextManager[Any]:
        """Megatron's model-parallel CUDA RNG stream for attention dropout, as its ``DotProductAttention`` uses.

        Tensor-parallel ranks hold different heads and must draw different masks: the default generator is
        seeded alike on every rank, the tracker's ``model-parallel-rng`` state per rank. CPU dropout uses the CPU
        generator (the tracker is CUDA-only); with sequence parallelism megatron keeps the default stream too.
        """
        tracker = tensor_parallel.get_cuda_rng_tracker()
        if dropout == 0.0 or not _on_cuda(query) or self.config.sequence_parallel or tracker is None:
            return contextlib.nullcontext()
        return tracker.fork()

    def attends_rotated(self, query: torch.Tensor, key: torch.Tensor, packed_seq_params: Any) -> bool:
        """Whether :meth:`attend_rotated` serves these ``[T, heads, d]`` unpadded sequences.

        Prediction on GPUs: :class:`UnpaddedSequences` with their boundaries, bidirectional, nothing to record for a
        backward, no dropout to draw, one context-parallel rank, as many key heads as query heads, CUDA in fp16 /
        bf16 with Triton (:func:`fused_rotary_attention_available`).
        """
        return (
            isinstance(packed_seq_params, UnpaddedSequences)
            and packed_seq_params.boundaries is not None
            and self.attn_mask_type not in _CAUSAL_MASK_TYPES
            and not torch.is_grad_enabled()
            and not (self.training and self.dropout_p > 0)
            and not self.context_parallel
            and key.shape == query.shape
            and fused_rotary_attention_available(query)
        )

    def attend_rotated(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        packed: UnpaddedSequences,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """``[T, heads, d]`` query / key before RoPE and value -> ``[T, heads * d]``, RoPE and attention in one kernel.

        The same as :func:`bionemo.layers.rotary.apply_rotary` on query and key (``cos``/``sin [T, d]``) and then
        :meth:`forward` (the flash kernel), without writing the rotated query and key: for calls
        :meth:`attends_rotated` to (``bionemo.layers._varlen_attention_triton``).
        """
        from bionemo.layers._varlen_attention_triton import varlen_rotary_attention

        assert packed.boundaries is not None
        return varlen_rotary_attention(
            query, key, value, packed.boundaries, packed.longest, self.softmax_scale, cos, sin
        )

    def _attend_unpadded(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, packed: UnpaddedSequences
    ) -> torch.Tensor:
        """``[T, heads, head_dim]`` query/key/value of concatenated sequences -> ``[T, heads * head_dim]``."""
        if self.attn_mask_type in _CAUSAL_MASK_TYPES or (self.training and self.dropout_p > 0):
            raise ValueError("unpadded sequences: bidirectional attention without dropout only (prediction)")
        if self.context_parallel:
            raise ValueError("unpadded sequences: context_parallel_size 1 only")
        tokens, heads, head_dim = query.shape
        bounds = packed.boundaries
        if bounds is not None and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and _has_varlen():
            out = varlen_flash_attention(query, key, value, bounds, packed.longest, self.softmax_scale)
            return out.reshape(tokens, heads * head_dim)
        ids = packed.sequence_ids
        assert ids is not None, "UnpaddedSequences.sequence_ids is needed off CUDA / in fp32"
        same_sequence = ids[:, None] == ids[None, :]
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))  # [1, h, T, d]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=same_sequence, scale=self.softmax_scale, enable_gqa=k.shape[1] != heads
        )
        return out[0].transpose(0, 1).reshape(tokens, heads * head_dim)


def sdpa_layer_spec(attn_mask_type: AttnMaskType = AttnMaskType.causal) -> ModuleSpec:
    """megatron-core's local (no Transformer Engine) transformer-layer spec with :class:`SDPACoreAttention`.

    Self-attention is :class:`bionemo.layers.rotary.RotarySelfAttention` (megatron's, with a fused RoPE); the
    linear layers add their bias inside the matrix multiply without tensor parallelism
    (:mod:`bionemo.layers.fused_bias_linear`), and in prediction on GPUs the MLP's first one its GELU too
    (:mod:`bionemo.layers.gelu_epilogue`); the layers' LayerNorms are :mod:`bionemo.layers.layer_norm`'s
    (:class:`~bionemo.layers.layer_norm.TritonLayerNorm` unless ``BIONEMO_TRITON_LAYERNORM=0``).

    Args:
        attn_mask_type: ``causal`` for decoders (GPT), ``padding`` for bidirectional encoders (BERT, ESM-2).
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from bionemo.layers.fused_bias_linear import FusedBiasColumnParallelLinear, FusedBiasRowParallelLinear
    from bionemo.layers.gelu_epilogue import EpilogueTransformerLayer
    from bionemo.layers.layer_norm import local_layer_norm
    from bionemo.layers.rotary import RotarySelfAttention

    spec = get_gpt_layer_local_spec()
    # torch's LayerNorm (no Apex): the Triton one unless switched off
    for name in ("input_layernorm", "pre_mlp_layernorm"):
        if getattr(spec.submodules, name) is WrappedTorchNorm:
            setattr(spec.submodules, name, local_layer_norm)
    spec.submodules.self_attention.module = RotarySelfAttention
    attention, mlp = spec.submodules.self_attention.submodules, spec.submodules.mlp.submodules
    attention.linear_qkv, attention.linear_proj = FusedBiasColumnParallelLinear, FusedBiasRowParallelLinear
    mlp.linear_fc1, mlp.linear_fc2 = FusedBiasColumnParallelLinear, FusedBiasRowParallelLinear
    spec.module = EpilogueTransformerLayer  # megatron's layer; its MLP runs as GeluEpilogueMLP
    spec.submodules.self_attention.params = {"attn_mask_type": attn_mask_type}
    spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
    return spec
