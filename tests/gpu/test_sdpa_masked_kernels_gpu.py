"""Padded (masked) attention on CUDA runs on flash / memory-efficient kernels, not cuDNN's (see MASKED_BACKENDS)."""

import pytest
import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from bionemo.layers import SDPACoreAttention

pytestmark = pytest.mark.gpu


def test_masked_bf16_attention_avoids_cudnn_and_matches_fp32_math():
    config = TransformerConfig(num_layers=1, hidden_size=1024, num_attention_heads=16)
    attention = SDPACoreAttention(config, layer_number=1, attn_mask_type=AttnMaskType.padding, attention_type="self")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(270, 64, 16, 64, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    valid = torch.arange(270, device="cuda")[None, :] < torch.randint(200, 271, (64, 1), device="cuda", generator=gen)
    mask = ~valid[:, None, None, :]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        out = attention.eval()(q, k, v, mask)
        torch.cuda.synchronize()
    kernels = [event.key for event in profile.key_averages()]
    assert not [name for name in kernels if "cudnn" in name.lower()], kernels
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        reference = attention(q.float(), k.float(), v.float(), mask)
    rows = valid.T[..., None]  # [s, b, 1]
    torch.testing.assert_close(out.float() * rows, reference * rows, atol=2e-2, rtol=2e-2)
