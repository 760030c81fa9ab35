"""RotarySelfAttention's Triton RoPE on a GPU: equal to megatron's eager RoPE, forward and backward."""

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rope_equals_megatron_eager_rope_on_cuda(dtype):
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    from bionemo.layers.rotary import apply_rotary, fused_rotary_available, rotary_tables

    torch.manual_seed(0)
    s, b, h, d = 300, 4, 20, 32
    mixed = torch.randn(s, b, h, 3 * d, device="cuda", dtype=dtype)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    freqs = torch.outer(torch.arange(s, device="cuda", dtype=torch.float32), inv_freq)
    freqs = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
    query = mixed[..., :d].detach().requires_grad_()
    reference = query.detach().clone().requires_grad_()
    assert fused_rotary_available(query)
    cos, sin = rotary_tables(freqs, dtype)
    ours = apply_rotary(query, cos, sin)
    theirs = _apply_rotary_pos_emb_bshd(reference, freqs)
    grad = torch.randn_like(ours)
    ours.backward(grad)
    theirs.backward(grad)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(ours, theirs, **tolerance)
    torch.testing.assert_close(query.grad, reference.grad, **tolerance)
