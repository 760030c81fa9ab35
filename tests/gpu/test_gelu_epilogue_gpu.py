"""GeluEpilogueMLP on a GPU: the cuBLASLt bias + GELU epilogue in bf16 prediction, against an fp64 reference."""

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import bionemo.layers.gelu_epilogue as epilogue
from bionemo.layers import GeluEpilogueMLP

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("hidden", "ffn"), [(640, 2560), (1280, 5120)])
def test_the_epilogue_is_no_farther_from_fp64_than_megatrons_two_kernels(monkeypatch, hidden, ffn):
    """ESM-2 scales: LayerNorm-like inputs, weights ~N(0, 0.02). The epilogue (tanh GELU on the fp32 accumulator)
    against megatron's MLP (pre-activation rounded to bf16, then exact GELU), both against exact GELU in fp64."""
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec, build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from bionemo.layers import FusedBiasColumnParallelLinear, FusedBiasRowParallelLinear
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=1, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=20, activation_func=F.gelu,
        params_dtype=torch.bfloat16, bf16=True,
    )  # fmt: skip
    submodules = MLPSubmodules(linear_fc1=FusedBiasColumnParallelLinear, linear_fc2=FusedBiasRowParallelLinear)
    mlp: Any = build_module(ModuleSpec(module=GeluEpilogueMLP, submodules=submodules), config=config)
    mlp = mlp.cuda().eval()
    with torch.no_grad():
        for p in mlp.parameters():
            p.normal_(0, 0.02)
        x = torch.randn(8192, 1, hidden, device="cuda").bfloat16()
        assert epilogue.gelu_epilogue_applies(mlp, x)
        fused, _ = mlp(x)
        monkeypatch.setenv(epilogue.SWITCH, "0")
        assert not epilogue.gelu_epilogue_applies(mlp, x)
        unfused, _ = mlp(x)
        weights = {name: p.double() for name, p in mlp.named_parameters()}
        middle = F.gelu(F.linear(x.double(), weights["linear_fc1.weight"], weights["linear_fc1.bias"]))
        reference = F.linear(middle, weights["linear_fc2.weight"], weights["linear_fc2.bias"])
    fused_error, unfused_error = (fused.double() - reference).abs(), (unfused.double() - reference).abs()
    assert fused_error.mean() <= unfused_error.mean() * 1.05
    assert fused_error.max() <= unfused_error.max() * 1.25
