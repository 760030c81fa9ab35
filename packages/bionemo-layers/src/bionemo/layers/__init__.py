"""Model building blocks on megatron-core in plain torch (no Transformer Engine), for CPUs and GPUs.

- :mod:`~bionemo.layers.sdpa_attention`: core attention on torch SDPA (padded and unpadded batches) and
  :func:`sdpa_layer_spec`, megatron-core's local transformer-layer spec built from the blocks below;
- :mod:`~bionemo.layers.rotary`: self-attention whose RoPE is one Triton kernel per tensor on GPUs;
- :mod:`~bionemo.layers.layer_norm`: LayerNorm in Triton on GPUs;
- :mod:`~bionemo.layers.fused_bias_linear`: parallel linears that add the bias inside the matrix multiply;
- :mod:`~bionemo.layers.gelu_epilogue`: an MLP whose first matrix multiply applies GELU too, in GPU prediction;
- :mod:`~bionemo.layers.residual_gemm`: a transformer block whose residual adds run inside the matrix multiplies, in
  GPU prediction;
- :mod:`~bionemo.layers.context_parallel`: sequence chunks and key / value gathers for bidirectional encoders;
- :mod:`~bionemo.layers.lora`: LoRA adapters on megatron-core's tensor-parallel linears;
- :mod:`~bionemo.layers.keyed_dropout`: dropout whose masks are the same on every parallel layout.

Triton is optional: without it the GPU kernels fall back to torch's. Importing this package imports megatron-core
(after ``bionemo.core.megatron_env.prepare_megatron_import``), never Lightning or NeMo.
"""

# First: lets megatron-core import on machines with nvcc but no GPU, before any submodule imports it.
from bionemo.layers import _megatron_ready  # noqa: F401  # isort: skip

from bionemo.layers.context_parallel import (
    chunk_length,
    context_parallel_group,
    gather_keys,
    gather_sequence,
    local_chunk,
)
from bionemo.layers.fused_bias_linear import (
    FusedBiasColumnParallelLinear,
    FusedBiasRowParallelLinear,
    LinearIntoMainGrad,
)
from bionemo.layers.gelu_epilogue import EpilogueTransformerLayer, GeluEpilogueMLP
from bionemo.layers.keyed_dropout import KeyedDropout, keyed_dropout, set_dropout_step
from bionemo.layers.layer_norm import TritonLayerNorm, local_layer_norm, triton_layer_norm_enabled
from bionemo.layers.lora import (
    LoRAConfig,
    LoRALinear,
    LoRATarget,
    apply_lora,
    load_lora_state_dict,
    lora_modules,
    lora_state_dict,
    merge_lora,
)
from bionemo.layers.residual_gemm import ResidualInGemmBlock
from bionemo.layers.rotary import RotarySelfAttention, apply_rotary, fused_rotary_available, rotary_tables
from bionemo.layers.sdpa_attention import (
    SDPACoreAttention,
    UnpaddedSequences,
    sdpa_layer_spec,
    varlen_attention_available,
)

__all__ = [
    "EpilogueTransformerLayer",
    "FusedBiasColumnParallelLinear",
    "FusedBiasRowParallelLinear",
    "GeluEpilogueMLP",
    "KeyedDropout",
    "LinearIntoMainGrad",
    "LoRAConfig",
    "LoRALinear",
    "LoRATarget",
    "ResidualInGemmBlock",
    "RotarySelfAttention",
    "SDPACoreAttention",
    "TritonLayerNorm",
    "UnpaddedSequences",
    "apply_lora",
    "apply_rotary",
    "chunk_length",
    "context_parallel_group",
    "fused_rotary_available",
    "gather_keys",
    "gather_sequence",
    "keyed_dropout",
    "load_lora_state_dict",
    "local_chunk",
    "local_layer_norm",
    "lora_modules",
    "lora_state_dict",
    "merge_lora",
    "rotary_tables",
    "sdpa_layer_spec",
    "set_dropout_step",
    "triton_layer_norm_enabled",
    "varlen_attention_available",
]
