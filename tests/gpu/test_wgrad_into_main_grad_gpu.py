"""Weight gradients straight into megatron DDP's fp32 ``main_grad`` on a GPU: one fp32-accumulating GEMM."""

import pytest
import torch
from megatron.core.transformer.transformer_config import TransformerConfig

from bionemo.layers import fused_bias_linear as fused
from bionemo.layers.fused_bias_linear import FusedBiasColumnParallelLinear, accumulate_weight_gradient
from bionemo.lightning import ensure_model_parallel
from support.megatron_ddp import ddp_hook, give_main_grad

pytestmark = pytest.mark.gpu


def test_this_torch_accumulates_a_bf16_gemm_into_fp32_in_place():
    """The fast path's precondition on the GPU image (else layers fall back to weight.grad and DDP's add)."""
    assert fused._fp32_accumulating_gemm()


def test_accumulation_equals_an_fp64_reference():
    torch.manual_seed(0)
    total = torch.randn(640, 1280, device="cuda")
    expected = total.double()
    for _ in range(3):  # micro-batches of 16 x 1026 tokens
        grad_output = torch.randn(16416, 640, device="cuda").bfloat16()
        x = torch.randn(16416, 1280, device="cuda").bfloat16()
        accumulate_weight_gradient(total, grad_output, x)
        expected += grad_output.double().t() @ x.double()
    # bf16 inputs are exact in fp32; the error is fp32 accumulation over 16,416 products (|sum| ~ 128, measured up
    # to 0.019), well below a bf16 rounding of the gradient (~0.5)
    torch.testing.assert_close(total.double(), expected, rtol=1e-4, atol=5e-2)


def test_a_bf16_layer_trains_into_main_grad_like_autograd_and_the_ddp_hook():
    ensure_model_parallel()
    config = TransformerConfig(
        num_layers=1, hidden_size=1280, num_attention_heads=20, params_dtype=torch.bfloat16, bf16=True
    )
    torch.manual_seed(0)
    layer = FusedBiasColumnParallelLinear(
        1280, 5120, config=config, init_method=torch.nn.init.normal_, bias=True, gather_output=False
    ).cuda()
    give_main_grad(layer)
    weight = layer.weight
    assert weight is not None
    expected = torch.zeros(5120, 1280, device="cuda", dtype=torch.float64)
    for micro_batch in range(2):
        x = torch.randn(1026, 16, 1280, device="cuda", generator=torch.Generator("cuda").manual_seed(micro_batch))
        x = x.bfloat16().requires_grad_()
        out, _ = layer(x)
        grad_output = torch.randn_like(out)
        out.backward(grad_output)
        expected += grad_output.reshape(-1, 5120).double().t() @ x.detach().reshape(-1, 1280).double()
        torch.testing.assert_close(x.grad, grad_output @ weight, rtol=0, atol=0)
        for param in layer.parameters():  # megatron DDP's hook: adds weight.grad unless already in main_grad
            ddp_hook(param)
    assert weight.grad_added_to_main_grad
    torch.testing.assert_close(weight.main_grad.double(), expected, rtol=1e-4, atol=5e-2)
    assert layer.bias.main_grad.abs().sum() > 0  # the bias gradient went through autograd and the hook
