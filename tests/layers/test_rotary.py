"""RotarySelfAttention / apply_rotary: megatron's RoPE arithmetic, applied after the QKV projection.

The Triton kernel (GPU path) runs here under Triton's interpreter on CPU tensors; its GPU run is in
tests/gpu/test_unpadded_gpu.py and the HF parity tests on GPUs.
"""

import importlib.util
from typing import Any

import pytest
import torch

from bionemo.layers.rotary import RotarySelfAttention, apply_rotary, rotary_tables
from bionemo.lightning import ensure_model_parallel


def angles(n: int, d: int, *shape: int) -> torch.Tensor:
    """ESM-2 style non-interleaved angles ``[n, *shape, d]`` (both halves equal), fp32."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(n, dtype=torch.float32), inv_freq)
    return torch.cat((freqs, freqs), dim=-1).reshape(n, *shape, d)


def megatron_rope(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    return _apply_rotary_pos_emb_bshd(t, freqs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_rotary_equals_megatron_on_strided_query_slices(dtype):
    torch.manual_seed(0)
    s, b, h, d = 9, 3, 4, 16
    mixed = torch.randn(s, b, h, 3 * d, dtype=dtype)  # megatron's fused QKV output, per head [q k v]
    query = mixed[..., :d]
    freqs = angles(s, d, 1, 1)
    cos, sin = rotary_tables(freqs, dtype)
    torch.testing.assert_close(apply_rotary(query, cos, sin), megatron_rope(query, freqs), rtol=0, atol=0)


def _attention(module_class: type, config) -> Any:
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.spec_utils import build_module

    from bionemo.layers import sdpa_layer_spec

    spec = sdpa_layer_spec(AttnMaskType.padding).submodules.self_attention
    spec.module = module_class
    return build_module(spec, config=config, layer_number=1)


@pytest.mark.parametrize("unpadded", [False, True])
def test_rotary_self_attention_equals_megatron_self_attention(unpadded):
    """Same weights, same angles: outputs and input gradients of megatron's SelfAttention (its own RoPE)."""
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.transformer_config import TransformerConfig

    from bionemo.layers import UnpaddedSequences

    ensure_model_parallel()
    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        use_cpu_initialization=True,
        attention_dropout=0.0,
        hidden_dropout=0.0,
    )
    ours, theirs = _attention(RotarySelfAttention, config), _attention(SelfAttention, config)
    theirs.load_state_dict(ours.state_dict())
    lengths = [5, 9, 3]
    if unpadded:
        sequence_ids = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))
        positions = torch.cat([torch.arange(n) for n in lengths])
        bounds = torch.tensor([0, 5, 14, 17], dtype=torch.int32)
        packed = UnpaddedSequences(boundaries=bounds, longest=9, sequence_ids=sequence_ids, positions=positions)
        hidden = torch.randn(17, 1, 32)
        freqs = angles(9, 8, 1)[positions]  # [T, 1, d]
        kwargs = {"attention_mask": None, "packed_seq_params": packed}
    else:
        hidden = torch.randn(9, 3, 32)
        padding = torch.arange(9)[None, :] >= torch.tensor(lengths)[:, None]
        freqs = angles(9, 8, 1, 1)
        kwargs = {"attention_mask": padding[:, None, None, :]}
    outputs, grads = [], []
    for module in (ours, theirs):
        x = hidden.clone().requires_grad_()
        out, _ = module(x, rotary_pos_emb=freqs, **kwargs)
        out.square().sum().backward()
        outputs.append(out)
        grads.append(x.grad)
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-6)


def _interpreted_kernel_module(monkeypatch):
    """A fresh copy of bionemo.layers._rotary_triton whose kernel runs in Triton's CPU interpreter."""
    pytest.importorskip("triton")
    import bionemo.layers._rotary_triton as compiled

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec = importlib.util.spec_from_file_location("_rotary_triton_interpreted", compiled.__file__)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("d", "dtype"), [(16, torch.float32), (12, torch.float32), (16, torch.bfloat16)])
def test_triton_kernel_forward_and_backward_equal_the_eager_arithmetic(monkeypatch, d, dtype):
    """Strided query slice in, contiguous rotation out; backward = autograd of the eager formula.

    ``d = 12``: a half of 6 columns, not a power of two (masked lanes).
    """
    kernel = _interpreted_kernel_module(monkeypatch)
    torch.manual_seed(1)
    s, b, h = 7, 2, 3
    query = torch.randn(s, b, h, 3 * d, dtype=dtype)[..., d : 2 * d]
    cos, sin = rotary_tables(angles(s, d, 1, 1) * 0.37, dtype)
    out = kernel.rotate_strided(query, cos, sin)
    assert out.is_contiguous()
    reference = apply_rotary(query.float(), cos.float(), sin.float())
    tolerance = {"rtol": 0, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    torch.testing.assert_close(out.float(), reference, **tolerance)

    grad = torch.randn(s, b, h, d, dtype=dtype).transpose(0, 1).contiguous().transpose(0, 1)  # strided grad
    leaf = query.float().detach().requires_grad_()
    apply_rotary(leaf, cos.float(), sin.float()).backward(grad.float())
    assert leaf.grad is not None
    torch.testing.assert_close(kernel.rotate_strided(grad, cos, sin, backward=True).float(), leaf.grad, **tolerance)


def test_cosines_and_sines_are_made_once_per_angles_tensor_not_per_layer(monkeypatch):
    """Every layer of a forward gets the same angles tensor: one rotary_tables call for the whole block."""
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_config import TransformerConfig

    from bionemo.layers import rotary, sdpa_layer_spec

    ensure_model_parallel()
    calls = []
    monkeypatch.setattr(rotary, "rotary_tables", lambda f, d: calls.append(d) or rotary_tables(f, d))
    config = TransformerConfig(num_layers=3, hidden_size=32, num_attention_heads=4, use_cpu_initialization=True)
    block = TransformerBlock(config, spec=sdpa_layer_spec(AttnMaskType.padding)).eval()
    freqs = angles(7, 8, 1, 1)
    with torch.no_grad():
        block(torch.randn(7, 2, 32), None, rotary_pos_emb=freqs)
        assert len(calls) == 1
        block(torch.randn(7, 2, 32), None, rotary_pos_emb=freqs)  # the model's cached angles: still one
        assert len(calls) == 1
        block(torch.randn(7, 2, 32), None, rotary_pos_emb=freqs.clone())  # other angles: made again
        assert len(calls) == 2
        freqs.mul_(1.0)  # changed in place: made again
        block(torch.randn(7, 2, 32), None, rotary_pos_emb=freqs)
        assert len(calls) == 3


def test_angles_made_under_inference_mode_are_shared_too(monkeypatch):
    """Unpadded prediction makes its angles inside ``torch.inference_mode`` (no version counter to read)."""
    from bionemo.layers import rotary

    calls = []
    monkeypatch.setattr(rotary, "rotary_tables", lambda f, d: calls.append(d) or rotary_tables(f, d))
    with torch.inference_mode():
        freqs = angles(7, 8, 1, 1)
        first = rotary._shared_tables(freqs, torch.bfloat16)
        assert rotary._shared_tables(freqs, torch.bfloat16) is first
        rotary._shared_tables(freqs.clone(), torch.bfloat16)
    assert len(calls) == 2
