"""The fused RoPE + varlen attention kernel on a GPU, bf16: equal to our RoPE kernel then torch's flash kernel."""

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("lengths", [[120, 129, 1, 64, 97], [700, 765, 513, 31]], ids=["short", "long"])
def test_fused_kernel_equals_rope_then_flash_attention(head_dim, lengths):
    from bionemo.layers._rotary_triton import rotate_strided
    from bionemo.layers._varlen_attention_triton import varlen_rotary_attention
    from bionemo.layers.rotary import rotary_tables

    torch.manual_seed(0)
    tokens, heads = sum(lengths), 20
    qkv = torch.randn(tokens, heads, 3, head_dim, device="cuda", dtype=torch.bfloat16)  # megatron's fused layout
    query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    positions = torch.cat([torch.arange(n, device="cuda") for n in lengths]).float()
    inverse = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device="cuda").float() / head_dim))
    angles = torch.outer(positions, inverse)
    cos, sin = rotary_tables(torch.cat((angles, angles), dim=-1), torch.bfloat16)
    bounds = torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)
    longest, scale = max(lengths), head_dim**-0.5

    ours = varlen_rotary_attention(query, key, value, bounds, longest, scale, cos, sin)
    rotated_query, rotated_key = (rotate_strided(t[:, None], cos, sin)[:, 0] for t in (query, key))
    theirs = torch.ops.aten._flash_attention_forward(
        rotated_query, rotated_key, value, bounds, bounds, longest, longest, 0.0, False, False, scale=scale
    )[0].reshape(tokens, heads * head_dim)
    assert ours.shape == theirs.shape
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-2, atol=2e-2)
    assert (ours.float() - theirs.float()).abs().mean() < 2e-3  # bf16 rounding, not a mask or rotation error
