"""LoRA's one-node updates on a GPU in bf16 under megatron DDP: output, input gradient and the factors' ``main_grad``
against an fp64 reference, for a column-parallel fc1 and for an fc2 that applies the MLP's GELU itself."""

import pytest
import torch
import torch.nn.functional as F
from megatron.core.transformer.transformer_config import TransformerConfig

from bionemo.layers import LoRAConfig, LoRALinear
from bionemo.layers.fused_bias_linear import FusedBiasColumnParallelLinear, FusedBiasRowParallelLinear
from bionemo.lightning import ensure_model_parallel
from support.megatron_ddp import ddp_hook, give_main_grad

pytestmark = pytest.mark.gpu

CASES = [("fc1", 1280, 5120, None, "_LowRankUpdateBackward"), ("fc2", 5120, 1280, F.gelu, "_GeluLowRankBackward")]


@pytest.mark.parametrize(("name", "size_in", "size_out", "activation", "node"), CASES, ids=[c[0] for c in CASES])
def test_a_bf16_adapter_trains_into_main_grad_like_an_fp64_reference(name, size_in, size_out, activation, node):
    ensure_model_parallel()
    config = TransformerConfig(
        num_layers=1, hidden_size=1280, num_attention_heads=20, params_dtype=torch.bfloat16, bf16=True
    )
    torch.manual_seed(0)
    if activation is None:
        base = FusedBiasColumnParallelLinear(
            size_in, size_out, config=config, init_method=torch.nn.init.normal_, bias=True, gather_output=False
        )
    else:
        base = FusedBiasRowParallelLinear(
            size_in, size_out, config=config, init_method=torch.nn.init.normal_, bias=True, input_is_parallel=True,
            skip_bias_add=True,
        )  # fmt: skip
    layer = LoRALinear(base.cuda(), LoRAConfig(rank=8, alpha=16), activation=activation)
    base.requires_grad_(False)
    with torch.no_grad():
        layer.lora_B.weight.normal_()  # B starts at zero: make the update and A's gradient non-trivial
    give_main_grad(layer.lora_A)
    give_main_grad(layer.lora_B)
    a, b = layer.lora_A.weight, layer.lora_B.weight
    expected_a = torch.zeros(8, size_in, device="cuda", dtype=torch.float64)
    expected_b = torch.zeros(size_out, 8, device="cuda", dtype=torch.float64)
    for micro_batch in range(2):
        x = torch.randn(1026, 16, size_in, device="cuda", generator=torch.Generator("cuda").manual_seed(micro_batch))
        x = x.bfloat16().requires_grad_()
        out, bias = layer(x)
        assert bias is None
        assert type(out.grad_fn).__name__ == node
        grad = torch.randn_like(out)
        out.backward(grad)
        x64 = x.detach().reshape(-1, size_in).double().requires_grad_()
        activated = x64 if activation is None else F.gelu(x64)
        a64, b64, w64 = a.detach().double(), b.detach().double(), base.weight.detach().double()
        hidden = activated @ a64.t()
        reference = activated @ w64.t() + base.bias.double() + 2.0 * hidden @ b64.t()
        g64 = grad.reshape(-1, size_out).double()
        (x_grad,) = torch.autograd.grad(reference, x64, g64)
        # bf16 output and input gradient: one rounding of values ~ 40-70 plus bf16 GEMM accumulation
        torch.testing.assert_close(out.double().reshape(-1, size_out), reference, rtol=2e-2, atol=0.5)
        torch.testing.assert_close(x.grad.double().reshape(-1, size_in), x_grad, rtol=2e-2, atol=0.5)
        expected_a += 2.0 * (g64 @ b64).t() @ activated.detach()
        expected_b += 2.0 * g64.t() @ hidden.detach()
        for factor in (a, b):
            ddp_hook(factor)
    assert a.grad_added_to_main_grad
    assert b.grad_added_to_main_grad
    for label, factor, expected in (("A", a, expected_a), ("B", b, expected_b)):
        scale = expected.abs().max().item()
        torch.testing.assert_close(factor.main_grad.double(), expected, rtol=2e-2, atol=2e-2 * scale, msg=label)
