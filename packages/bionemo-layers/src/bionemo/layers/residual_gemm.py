"""Prediction through a megatron-core block whose residual adds run inside the GEMMs, on GPUs.

megatron-core's ``TransformerLayer`` adds the residual stream to the attention's output and to the MLP's output with
a kernel of its own each (its bias-dropout-add): two passes per layer that read two ``[tokens, hidden]`` tensors and
write a third, 5.5% (650M) to 7.1% (150M) of an ESM-2 prediction batch's GPU time on an H100
(docs/benchmarks.md#prediction-kernels). ``torch.addmm(residual, x, weight.T)`` adds the residual in the GEMM's
epilogue instead (cuBLAS reads it as its C matrix, beta = 1), but then the layer's bias cannot join that GEMM too:
torch has no GEMM taking both a C matrix and a bias vector. Those biases (the attention's output projection's and
the MLP's second linear layer's) are constant vectors, so :func:`forward_residual_in_gemm` carries their running
sum, ``offset`` (fp32 ``[hidden]``), beside the stream instead: the tensor passed from GEMM to GEMM is the residual
stream minus ``offset``, every LayerNorm normalizes ``stream + offset`` in its own kernel
(:func:`bionemo.layers.layer_norm.layer_norm_with_offset`), and the block's final LayerNorm (or, in a block without
one, a last add) returns what megatron's layers return. The rest of each layer is its own modules: the QKV
projection, RoPE and core attention (:meth:`bionemo.layers.rotary.RotarySelfAttention.attend`) and the MLP's first
half (:meth:`bionemo.layers.gelu_epilogue.GeluEpilogueMLP.activations`).

The arithmetic differs from megatron's only in where it rounds: each GEMM adds the residual to its fp32 accumulator
before its one rounding (megatron rounds the GEMM's output, then the sum), and the biases are summed in fp32.

:func:`residual_in_gemm_applies` decides per call: prediction (no gradient, eval mode) on CUDA in half precision,
layers built by :func:`bionemo.layers.sdpa_layer_spec` whose output projection and second MLP linear compute locally
(one tensor-parallel rank, no LoRA adapter), plain LayerNorms, no hooks on the block's modules (a caller capturing a
layer's output sees megatron's layers), no inference context, attention bias, cross attention or quantization.
Anything else runs megatron's block. :class:`ResidualInGemmBlock` is megatron's ``TransformerBlock`` taking this path
where it applies.

Switch: ``BIONEMO_RESIDUAL_IN_GEMM=0`` runs megatron's block in prediction too.
"""

import os
from typing import Any

import torch
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.transformer_block import TransformerBlock
from megatron.core.transformer.transformer_layer import TransformerLayer
from torch.nn.modules import module as torch_module

from bionemo.layers.fused_bias_linear import computes_locally
from bionemo.layers.gelu_epilogue import GeluEpilogueMLP
from bionemo.layers.layer_norm import layer_norm_with_offset
from bionemo.layers.rotary import RotarySelfAttention
from bionemo.layers.sdpa_attention import SDPACoreAttention, UnpaddedSequences

__all__ = ["SWITCH", "ResidualInGemmBlock", "forward_residual_in_gemm", "residual_in_gemm_applies"]

SWITCH = "BIONEMO_RESIDUAL_IN_GEMM"

_HALF = (torch.bfloat16, torch.float16)


def _plain_norm(module: Any) -> bool:
    """A ``torch.nn.LayerNorm`` over the last dimension with weight and bias (torch's or the Triton one)."""
    return (
        isinstance(module, torch.nn.LayerNorm)
        and module.weight is not None
        and module.bias is not None
        and len(module.normalized_shape) == 1
    )


def _layer_applies(layer: Any, rotary_pos_emb: Any, packed_seq_params: Any) -> bool:
    """Whether ``layer`` is a pre-LayerNorm layer of :func:`sdpa_layer_spec` that the residual GEMMs can run."""
    if not isinstance(layer, TransformerLayer):
        return False
    attention: Any = layer.self_attention
    mlp: Any = layer.mlp
    projection: Any = getattr(attention, "linear_proj", None)
    second: Any = getattr(mlp, "linear_fc2", None)
    config = layer.config
    return (
        isinstance(attention, RotarySelfAttention)
        and isinstance(attention.core_attention, SDPACoreAttention)
        and attention.handles(rotary_pos_emb, packed_seq_params)
        and isinstance(mlp, GeluEpilogueMLP)
        and isinstance(layer.pre_cross_attn_layernorm, IdentityOp)
        and isinstance(layer.cross_attention, IdentityOp)
        and _plain_norm(layer.input_layernorm)
        and _plain_norm(layer.pre_mlp_layernorm)
        and computes_locally(projection)
        and computes_locally(second)
        and not config.apply_residual_connection_post_layernorm
        and not config.fp32_residual_connection
    )


def _hooked(block: torch.nn.Module) -> bool:
    """Whether a forward hook (global, or on any module of ``block``) would miss calls this path skips."""
    if getattr(torch_module, "_global_forward_hooks", None) or getattr(torch_module, "_global_forward_pre_hooks", None):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in block.modules())


def _half_on_gpu(hidden_states: torch.Tensor) -> bool:
    """Half-precision hidden states on a GPU: where the residual GEMMs pay (and the LayerNorm offset is Triton's)."""
    return hidden_states.is_cuda and hidden_states.dtype in _HALF


def residual_in_gemm_applies(
    block: TransformerBlock, hidden_states: Any, rotary_pos_emb: Any, packed_seq_params: Any = None
) -> bool:
    """Whether :func:`forward_residual_in_gemm` runs ``block`` for these inputs (see the module)."""
    config = block.config
    return (
        os.environ.get(SWITCH, "1") != "0"
        and isinstance(hidden_states, torch.Tensor)
        and _half_on_gpu(hidden_states)
        and not torch.is_grad_enabled()
        and not block.training
        and not config.fp8
        and not getattr(config, "fp4", None)
        and (packed_seq_params is None or isinstance(packed_seq_params, UnpaddedSequences))
        and len(block.layers) > 0
        and (block.final_layernorm is None or _plain_norm(block.final_layernorm))
        and all(_layer_applies(layer, rotary_pos_emb, packed_seq_params) for layer in block.layers)
        and not _hooked(block)
    )


def _add_product(
    stream: torch.Tensor, x: torch.Tensor, linear: Any, offset: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``stream += x @ linear.weight.T`` in one GEMM and ``offset + linear.bias`` in fp32; returns both.

    In place: torch's out-of-place ``addmm`` first copies its C matrix into the result, a pass of its own.
    """
    rows = x.reshape(-1, x.shape[-1])
    stream.view(-1, stream.shape[-1]).addmm_(rows, linear.weight.t())
    bias = linear.bias
    if bias is None:
        return stream, offset
    return stream, (bias.float() if offset is None else offset + bias)


def forward_residual_in_gemm(
    block: TransformerBlock,
    hidden_states: torch.Tensor,
    attention_mask: Any,
    rotary_pos_emb: torch.Tensor,
    packed_seq_params: Any = None,
) -> torch.Tensor:
    """What ``block(hidden_states, attention_mask, rotary_pos_emb=..., packed_seq_params=...)`` returns.

    The residual adds run inside the GEMMs (see the module); for a call :func:`residual_in_gemm_applies` to.
    """
    stream, offset = hidden_states.clone(memory_format=torch.contiguous_format), None  # the GEMMs add into it
    layers: Any = block.layers
    for layer in layers:
        attention, mlp = layer.self_attention, layer.mlp
        normed = layer_norm_with_offset(layer.input_layernorm, stream, offset)
        attended = attention.attend(normed, attention_mask, rotary_pos_emb, packed_seq_params)
        stream, offset = _add_product(stream, attended, attention.linear_proj, offset)
        normed = layer_norm_with_offset(layer.pre_mlp_layernorm, stream, offset)
        stream, offset = _add_product(stream, mlp.activations(normed), mlp.linear_fc2, offset)
    final: Any = block.final_layernorm
    if final is not None:
        return layer_norm_with_offset(final, stream, offset)
    return stream if offset is None else (stream + offset).to(stream.dtype)


class ResidualInGemmBlock(TransformerBlock):
    """megatron-core's ``TransformerBlock`` (same arguments and results), faster in GPU prediction.

    Where :func:`residual_in_gemm_applies`, its layers run with the residual adds inside the GEMMs (see the module).
    """

    def forward(  # type: ignore[override]
        self,
        hidden_states: Any,
        attention_mask: Any,
        context: Any = None,
        context_mask: Any = None,
        rotary_pos_emb: Any = None,
        **kwargs: Any,
    ) -> Any:
        """``TransformerBlock.forward``; see the class."""
        packed = kwargs.get("packed_seq_params")
        hidden: Any = hidden_states if self.pre_process else self.input_tensor
        plain = (
            context is None
            and context_mask is None
            and all(value is None for name, value in kwargs.items() if name != "packed_seq_params")
        )
        if plain and residual_in_gemm_applies(self, hidden, rotary_pos_emb, packed):
            return forward_residual_in_gemm(self, hidden, attention_mask, rotary_pos_emb, packed)
        return super().forward(hidden_states, attention_mask, context, context_mask, rotary_pos_emb, **kwargs)
