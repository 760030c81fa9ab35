"""TritonLayerNorm on a GPU: its kernel equals torch's LayerNorm; anything needing a gradient stays on torch's."""

import pytest
import torch
import torch.nn.functional as F

import bionemo.lightning._layer_norm_triton as kernel
from bionemo.lightning.layer_norm import TritonLayerNorm

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


def test_training_stays_on_torch_layer_norm(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the Triton forward has no backward: not for tensors that need a gradient")

    monkeypatch.setattr(kernel, "layer_norm_rows", refuse)
    norm = TritonLayerNorm(64, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    norm(x).sum().backward()
    assert x.grad is not None
    assert norm.weight.grad is not None
