"""TritonLayerNorm on a GPU: its kernels equal torch's LayerNorm, forward and backward; other inputs stay on torch's."""

import pytest
import torch
import torch.nn.functional as F

import bionemo.layers._layer_norm_triton as kernel
from bionemo.layers.layer_norm import TritonLayerNorm

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("width", "dtype"), [(640, torch.bfloat16), (1280, torch.bfloat16), (640, torch.float32)])
def test_triton_layer_norm_equals_torch_on_cuda(width, dtype):
    torch.manual_seed(0)
    norm = TritonLayerNorm(width, device="cuda", dtype=dtype)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
        x = torch.randn(4096, 2, width, device="cuda", dtype=dtype) * 3 + 1
        ours = norm(x)
        theirs = F.layer_norm(x, (width,), norm.weight, norm.bias, norm.eps)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1.6e-2}
    torch.testing.assert_close(ours, theirs, **tolerance)


@pytest.mark.parametrize(("width", "dtype"), [(640, torch.bfloat16), (1280, torch.bfloat16), (1280, torch.float32)])
def test_training_kernels_equal_torch_autograd_on_cuda(width, dtype):
    """16,416 rows (16 x 1026, a micro-batch of the GPU recipe): many rows per backward program, a short last one."""
    torch.manual_seed(0)
    norm = TritonLayerNorm(width, device="cuda", dtype=dtype)
    reference = torch.nn.LayerNorm(width, device="cuda", dtype=torch.float32)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
        reference.load_state_dict({k: v.float() for k, v in norm.state_dict().items()})
    x = (torch.randn(1026, 16, width, device="cuda") * 3 + 1).to(dtype).requires_grad_()
    x_reference = x.detach().float().requires_grad_()
    dy = torch.randn(1026, 16, width, device="cuda").to(dtype)
    out = norm(x)
    out.backward(dy)
    expected = reference(x_reference)
    expected.backward(dy.float())
    pairs = [
        (out, expected),
        (x.grad, x_reference.grad),
        (norm.weight.grad, reference.weight.grad),
        (norm.bias.grad, reference.bias.grad),
    ]
    for name, (ours, theirs) in zip(("out", "dx", "dw", "db"), pairs, strict=True):
        assert ours is not None, name
        assert theirs is not None, name
        assert ours.dtype == dtype, name
        scale = 1 + theirs.abs().max()  # dw, db: sums over 16,416 rows
        error = float((ours.float() - theirs).abs().max() / scale)
        assert error < (2e-5 if dtype == torch.float32 else 1.6e-2), (name, error)


def test_non_contiguous_inputs_stay_on_torch_layer_norm(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the Triton kernels take contiguous rows only")

    monkeypatch.setattr(kernel.TrainingLayerNorm, "apply", refuse)
    monkeypatch.setattr(kernel, "layer_norm_rows", refuse)
    norm = TritonLayerNorm(64, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 8, device="cuda", dtype=torch.bfloat16).t().requires_grad_()  # [8, 64], not contiguous
    norm(x).sum().backward()
    assert x.grad is not None
    assert norm.weight.grad is not None
