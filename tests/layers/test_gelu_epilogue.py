"""GeluEpilogueMLP: megatron's MLP, whose first GEMM applies bias + GELU in its epilogue in GPU prediction.

The CUDA-only decision is stood in for on CPU, where ``torch._addmm_activation`` is the same arithmetic without the
fusion; tests/gpu/test_gelu_epilogue_gpu.py checks the cuBLASLt epilogue's accuracy on a GPU.
"""

import logging
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import bionemo.layers.gelu_epilogue as epilogue
from bionemo.layers import EpilogueTransformerLayer, GeluEpilogueMLP, LoRAConfig, apply_lora
from bionemo.lightning import ensure_model_parallel


def _layer(dtype: torch.dtype = torch.float32, **settings) -> Any:
    """One transformer layer of the local layer spec (megatron builds its MLP), weights ~N(0, 0.3)."""
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    from bionemo.layers import sdpa_layer_spec

    ensure_model_parallel()
    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=1, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
        activation_func=F.gelu, params_dtype=dtype, **settings,
    )  # fmt: skip
    layer: Any = build_module(sdpa_layer_spec(AttnMaskType.padding), config=config)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.3)
    return layer.to(dtype).eval()


def _mlp(dtype: torch.dtype = torch.float32, **settings) -> Any:
    return _layer(dtype, **settings).mlp


def test_the_local_spec_builds_its_mlp_as_megatron_does_then_runs_it_as_gelu_epilogue_mlp(caplog):
    """megatron passes the MLP its tensor-parallel group (it warns for an MLP class it does not know)."""
    with caplog.at_level(logging.WARNING):
        layer = _layer()
    assert type(layer.mlp) is GeluEpilogueMLP
    assert isinstance(layer, EpilogueTransformerLayer)
    assert not [r for r in caplog.records if "MLP type" in r.getMessage()]


@pytest.fixture
def cuda_stand_in(monkeypatch):
    """CPU tensors answer ``is_cuda``: the decision's other conditions are what is tested."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))


def test_the_epilogue_path_gives_megatrons_results(monkeypatch):
    """Forced on (CPU: ``torch._addmm_activation`` is the GEMM then exact GELU), megatron's MLP's output.

    On CUDA the epilogue is GELU's tanh form; tests/gpu/test_gelu_epilogue_gpu.py bounds that difference.
    """
    mlp = _mlp()
    x = torch.randn(7, 3, 32)
    calls = []
    fused_gemm = torch._addmm_activation  # pyright: ignore[reportPrivateImportUsage]

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return fused_gemm(*args, **kwargs)

    with torch.no_grad():
        exact, exact_bias = mlp(x)
        monkeypatch.setattr(epilogue, "gelu_epilogue_applies", lambda module, hidden: True)
        monkeypatch.setattr(torch, "_addmm_activation", counted)
        fused, fused_bias = mlp(x)
    assert calls == [{"use_gelu": True}]
    assert exact_bias is None
    assert fused_bias is None
    assert fused.shape == exact.shape
    torch.testing.assert_close(fused, exact, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("cuda_stand_in")
def test_it_applies_to_half_precision_prediction_only(monkeypatch):
    mlp = _mlp(torch.bfloat16)
    x = torch.zeros(2, 1, 32, dtype=torch.bfloat16)
    assert not epilogue.gelu_epilogue_applies(mlp, x)  # gradients are recorded: training keeps megatron's MLP
    with torch.no_grad():
        assert epilogue.gelu_epilogue_applies(mlp, x)
        assert not epilogue.gelu_epilogue_applies(mlp, x.float())
        monkeypatch.setenv(epilogue.SWITCH, "0")
        assert not epilogue.gelu_epilogue_applies(mlp, x)


@pytest.mark.usefixtures("cuda_stand_in")
@pytest.mark.parametrize(
    "settings",
    [{"gated_linear_unit": True}, {"bias_activation_fusion": True}, {"add_bias_linear": False}],
    ids=["glu", "megatron-fusion", "no-bias"],
)
def test_other_mlps_stay_megatrons(settings):
    mlp = _mlp(torch.bfloat16, **settings)
    with torch.no_grad():
        assert not epilogue.gelu_epilogue_applies(mlp, torch.zeros(2, 1, 32, dtype=torch.bfloat16))


@pytest.mark.usefixtures("cuda_stand_in")
def test_a_lora_adapted_first_linear_stays_megatrons():
    """The adapter adds its own product to fc1's output: the epilogue would apply GELU before it."""
    mlp = _mlp(torch.bfloat16)
    assert apply_lora(torch.nn.ModuleDict({"mlp": mlp}), LoRAConfig(rank=2, targets=frozenset({"mlp.linear_fc1"})))
    with torch.no_grad():
        assert not epilogue.gelu_epilogue_applies(mlp, torch.zeros(2, 1, 32, dtype=torch.bfloat16))
