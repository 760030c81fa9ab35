"""install_compiled_rope on a GPU: torch.compile'd (megatron's jit_fuser) RoPE against megatron's eager one."""

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_compiled_rope_matches_eager_in_bf16():
    from bionemo.core.megatron_env import prepare_megatron_import

    prepare_megatron_import()
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from bionemo.lightning import install_compiled_rope

    original = rope_utils._apply_rotary_pos_emb_bshd
    try:
        install_compiled_rope()
        seq, batch, heads, dim = 1026, 4, 16, 64
        freqs = RotaryEmbedding(kv_channels=dim, rotary_percent=1.0).cuda()(seq)  # [s, 1, 1, d]
        gen = torch.Generator(device="cuda").manual_seed(0)
        t = torch.randn(seq, batch, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
        grad = torch.randn(t.shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        results = []
        for rope in (rope_utils._apply_rotary_pos_emb_bshd, original):
            x = t.clone().requires_grad_(True)
            out = rope(x, freqs)
            out.backward(grad)
            results.append((out, x.grad))
        (fused, fused_grad), (eager, eager_grad) = results
        assert fused.dtype == eager.dtype == torch.bfloat16
        # eager rounds to bf16 after every op, the fused kernel once: a few bf16 ulps apart
        torch.testing.assert_close(fused, eager, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(fused_grad, eager_grad, rtol=2e-2, atol=2e-2)
    finally:
        rope_utils._apply_rotary_pos_emb_bshd = original
