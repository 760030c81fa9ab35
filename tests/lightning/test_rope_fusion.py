"""install_compiled_rope: megatron's unfused RoPE swapped for a compiled copy of itself (GPU timing: tools/)."""

import pytest
import torch


@pytest.fixture
def restore_rope():
    from megatron.core.models.common.embeddings import rope_utils

    original = rope_utils._apply_rotary_pos_emb_bshd
    yield rope_utils
    rope_utils._apply_rotary_pos_emb_bshd = original


def reference_rope(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """RoPE written out: rotate each (x1, x2) half-pair by the position's angle."""
    x1, x2 = t.float().chunk(2, dim=-1)
    cos, sin = freqs.cos().chunk(2, dim=-1)[0], freqs.sin().chunk(2, dim=-1)[0]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def test_compiled_rope_is_megatrons_rope_compiled(restore_rope):
    from bionemo.lightning import install_compiled_rope

    compiled_functions = []

    def compile(function):
        compiled_functions.append(function)
        return torch.compile(function, backend="aot_eager")  # traced and re-run without a C compiler

    original = restore_rope._apply_rotary_pos_emb_bshd
    assert install_compiled_rope(compile)
    assert not install_compiled_rope(compile)  # idempotent: compiled once
    assert compiled_functions == [original]

    gen = torch.Generator().manual_seed(0)
    seq, batch, heads, dim = 6, 2, 3, 8
    angles = torch.rand(seq, 1, 1, dim // 2, generator=gen) * 3
    freqs = torch.cat((angles, angles), dim=-1)  # megatron's layout: [s, 1, 1, d]
    t = torch.randn(seq, batch, heads, dim, generator=gen, requires_grad=True)
    config = type("Config", (), {"apply_rope_fusion": False, "rotary_interleaved": False,
                                 "multi_latent_attention": False, "mrope_section": None})()  # fmt: skip
    out = restore_rope.apply_rotary_pos_emb(t, freqs, config, cp_group=object())
    torch.testing.assert_close(out, reference_rope(t.detach(), freqs))
    out.square().sum().backward()
    eager = t.detach().clone().requires_grad_(True)
    original(eager, freqs).square().sum().backward()
    torch.testing.assert_close(t.grad, eager.grad)
