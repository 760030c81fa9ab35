"""Rotary position embeddings applied by the attention module itself, in one fused kernel per tensor on GPUs.

Without Transformer Engine, megatron-core 0.15.3 applies RoPE (``rope_utils._apply_rotary_pos_emb_bshd``) to
the query and the key in about six elementwise passes each (cos and sin of the angles, two multiplies, a
negation and a concatenation for the half rotation, an add, a final concatenation), reading the strided
slices of the fused QKV projection: on an H200 a large share of an ESM-2 prediction batch's GPU time
(docs/benchmarks.md#one-prediction-batch).

:class:`RotarySelfAttention` (used by :func:`bionemo.layers.sdpa_layer_spec`) applies the same rotation
right after the QKV projection with :func:`apply_rotary`: on CUDA one Triton kernel per tensor (reads the
strided slice once, writes it once, fp32 arithmetic; its backward is the transposed rotation), elsewhere
megatron's arithmetic in eager PyTorch. Nothing of megatron is patched: the module is a ``SelfAttention``
subclass, and cases it does not handle (interleaved or fused RoPE, inference contexts, separate query and key
angles, megatron's per-sequence packed format) go to megatron unchanged.

Switch: ``BIONEMO_FUSED_ROPE=0`` runs the eager arithmetic on GPUs too.
"""

import os
import weakref
from typing import Any

import torch
from megatron.core.transformer.attention import SelfAttention

from bionemo.layers._triton import triton_importable

__all__ = ["RotarySelfAttention", "apply_rotary", "fused_rotary_available", "rotary_tables"]


def rotary_tables(freqs: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` as contiguous ``[n, d]`` tensors in ``dtype`` from angles ``[n, ..., d]`` (fp32).

    Rounded to ``dtype`` as megatron and Hugging Face do before multiplying.
    """
    angles = freqs.reshape(freqs.shape[0], freqs.shape[-1])
    return angles.cos().to(dtype).contiguous(), angles.sin().to(dtype).contiguous()


_last_tables: tuple[weakref.ref, torch.dtype, int, tuple[torch.Tensor, torch.Tensor]] | None = None


def _shared_tables(freqs: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rotary_tables` of ``freqs``, computed once while the same angles tensor comes back.

    Every layer of a forward gets the model's one angles tensor (and a model caches it per sequence length), so
    the cosines and sines are made once instead of once per layer. Held by a weak reference: a new tensor, or a
    freed one, recomputes; so does one changed in place since (its version counter; tensors made under
    ``torch.inference_mode`` have none: identity decides).
    """
    global _last_tables
    cached = _last_tables
    version = -1 if freqs.is_inference() else freqs._version
    if cached is not None and cached[0]() is freqs and cached[1] == dtype and cached[2] == version:
        return cached[3]
    tables = rotary_tables(freqs, dtype)
    _last_tables = (weakref.ref(freqs), dtype, version, tables)
    return tables


def fused_rotary_available(x: torch.Tensor) -> bool:
    """Whether :func:`apply_rotary` runs the Triton kernel for ``x`` (CUDA, Triton, not switched off)."""
    return x.is_cuda and os.environ.get("BIONEMO_FUSED_ROPE", "1") != "0" and triton_importable()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class _FusedRotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        from bionemo.layers._rotary_triton import rotate_strided

        ctx.save_for_backward(cos, sin)
        return rotate_strided(x, cos, sin)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # pyright: ignore[reportIncompatibleMethodOverride]
        from bionemo.layers._rotary_triton import rotate_strided

        cos, sin = ctx.saved_tensors
        return rotate_strided(grad, cos, sin, backward=True), None, None


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Non-interleaved RoPE of ``x [n, b, heads, d]`` with ``cos``/``sin [n, d]`` (from :func:`rotary_tables`).

    ``x * cos + rotate_half(x) * sin`` (megatron's and Hugging Face's ESM-2 formula); the result is contiguous.
    """
    if fused_rotary_available(x):
        return _FusedRotary.apply(x, cos, sin)  # pyright: ignore[reportReturnType]
    return x * cos[:, None, None, :] + _rotate_half(x) * sin[:, None, None, :]


class RotarySelfAttention(SelfAttention):
    """megatron-core's ``SelfAttention`` with RoPE applied by :func:`apply_rotary` after the QKV projection.

    Same arguments and results as ``SelfAttention``. ``rotary_pos_emb`` is megatron's angles tensor:
    ``[s, 1, 1, d]`` for ``[s, b, ...]`` hidden states, or ``[T, 1, d]`` per token for unpadded sequences
    (``packed_seq_params`` without ``cu_seqlens_q``, see :class:`bionemo.layers.UnpaddedSequences`).
    """

    _angles: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor, attention_mask: Any, *args: Any, **kwargs: Any):  # type: ignore[override]
        """``SelfAttention.forward``; RoPE is applied here when :meth:`_handles` the call."""
        angles = kwargs.get("rotary_pos_emb")
        if args or not self._handles(angles, kwargs):
            return super().forward(hidden_states, attention_mask, *args, **kwargs)
        self._angles = angles
        try:
            return super().forward(hidden_states, attention_mask, **{**kwargs, "rotary_pos_emb": None})
        finally:
            self._angles = None

    def get_query_key_value_tensors(self, hidden_states: Any, key_value_states: Any = None, split_qkv: bool = True):
        """Megatron's query, key and value ``[s, b, heads, d]``, with RoPE applied to query and key if asked."""
        out: Any = super().get_query_key_value_tensors(hidden_states, key_value_states, split_qkv)
        if self._angles is None or not split_qkv:
            return out
        query, key, value = out
        cos, sin = _shared_tables(self._angles, query.dtype)
        return apply_rotary(query, cos, sin), apply_rotary(key, cos, sin), value

    def attend(
        self, hidden_states: torch.Tensor, attention_mask: Any, rotary_pos_emb: torch.Tensor, packed_seq_params: Any
    ) -> torch.Tensor:
        """The core attention's output ``[s, b, heads * d]``, which ``forward`` passes to the output projection.

        For a call that :meth:`handles` (no inference context), and a caller that runs the output projection's GEMM
        itself (:mod:`bionemo.layers.residual_gemm`). Megatron's steps: QKV projection, RoPE, ``thd`` squeeze, core
        attention, ``thd`` reshape; where the core attention :meth:`~bionemo.layers.SDPACoreAttention.attends_rotated`
        (unpadded sequences on GPUs), RoPE and attention are one kernel reading the projection's output in place.
        """
        split: Any = super().get_query_key_value_tensors(hidden_states)
        query, key, value = split
        cos, sin = _shared_tables(rotary_pos_emb, query.dtype)
        core: Any = self.core_attention
        if packed_seq_params is not None:
            squeezed = query.squeeze(1), key.squeeze(1), value.squeeze(1)
            if getattr(core, "attends_rotated", None) and core.attends_rotated(*squeezed[:2], packed_seq_params):
                return core.attend_rotated(*squeezed, packed_seq_params, cos, sin).unsqueeze(1)
        query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        if packed_seq_params is not None:
            query, key, value = query.squeeze(1), key.squeeze(1), value.squeeze(1)
        out = self.core_attention(
            query, key, value, attention_mask, attn_mask_type=self.attn_mask_type, packed_seq_params=packed_seq_params
        )
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            out = out.reshape(out.size(0), 1, -1)
        return out

    def handles(self, rotary_pos_emb: Any, packed_seq_params: Any = None) -> bool:
        """Whether :meth:`attend` (and this module's own RoPE) serves a call with these arguments, no inference."""
        return self._handles(rotary_pos_emb, {"packed_seq_params": packed_seq_params})

    def _handles(self, angles: Any, kwargs: dict[str, Any]) -> bool:
        """Plain non-interleaved RoPE on one angles tensor, outside megatron's inference and fused paths."""
        config = self.config
        packed = kwargs.get("packed_seq_params")
        return (
            isinstance(angles, torch.Tensor)
            and kwargs.get("inference_context") is None
            and kwargs.get("inference_params") is None
            and not config.apply_rope_fusion
            and not config.rotary_interleaved
            and not config.multi_latent_attention
            and not config.flash_decode
            and not config.no_rope_freq
            and getattr(config, "rope_type", "rope") == "rope"
            and (packed is None or (packed.cu_seqlens_q is None and packed.cu_seqlens_kv is None))
        )
