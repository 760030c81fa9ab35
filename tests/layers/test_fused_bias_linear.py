"""Fused-bias parallel linears: megatron's results (bias added, not returned) and gradients on one TP rank."""

import pytest
import torch
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.transformer_config import TransformerConfig

from bionemo.layers import fused_bias_linear as fused
from bionemo.layers.fused_bias_linear import FusedBiasColumnParallelLinear, FusedBiasRowParallelLinear
from bionemo.lightning import ensure_model_parallel
from support.megatron_ddp import ddp_hook, give_main_grad

PAIRS = [(FusedBiasColumnParallelLinear, ColumnParallelLinear), (FusedBiasRowParallelLinear, RowParallelLinear)]


def build(cls: type, skip_bias_add: bool):
    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True)
    common = {"config": config, "init_method": torch.nn.init.normal_, "bias": True, "skip_bias_add": skip_bias_add}
    if issubclass(cls, ColumnParallelLinear):
        return cls(16, 24, gather_output=False, **common)
    return cls(16, 24, input_is_parallel=True, **common)


def same_weights(ours_class: type, megatron_class: type, skip_bias_add: bool):
    """Our layer and megatron's, with the same random weights and biases."""
    ensure_model_parallel()
    torch.manual_seed(0)
    ours, theirs = build(ours_class, skip_bias_add), build(megatron_class, skip_bias_add)
    with torch.no_grad():
        theirs.bias.normal_()
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def run(layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    out, bias = layer(x)
    total = out if bias is None else out + bias
    total.square().sum().backward()
    return total, bias


@pytest.mark.parametrize("skip_bias_add", [False, True])
@pytest.mark.parametrize(("ours_class", "megatron_class"), PAIRS)
def test_fused_bias_linear_gives_megatrons_output_and_gradients(ours_class, megatron_class, skip_bias_add):
    ours, theirs = same_weights(ours_class, megatron_class, skip_bias_add)
    x = torch.randn(5, 3, 16)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ours, bias_ours = run(ours, x_ours)
    out_theirs, bias_theirs = run(theirs, x_theirs)
    assert bias_ours is None  # already added
    assert (bias_theirs is not None) == skip_bias_add
    torch.testing.assert_close(out_ours, out_theirs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, rtol=1e-5, atol=1e-6)
    for name in ("weight", "bias"):
        torch.testing.assert_close(getattr(ours, name).grad, getattr(theirs, name).grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("ours_class", "megatron_class"), PAIRS)
def test_layers_needing_communication_are_megatrons(monkeypatch, ours_class, megatron_class):
    """With tensor parallelism (or another megatron extra) the bias comes back separately, as megatron does."""
    ensure_model_parallel()
    layer = build(ours_class, skip_bias_add=True)
    monkeypatch.setattr(fused, "_local", lambda _layer: False)
    out, bias = layer(torch.randn(5, 3, 16))
    assert bias is layer.bias
    monkeypatch.setattr(megatron_class, "forward", lambda self, *args, **kwargs: ("megatron", None))
    assert layer(torch.randn(5, 3, 16))[0] == "megatron"


@pytest.mark.parametrize(("ours_class", "megatron_class"), PAIRS)
def test_weight_gradients_go_into_main_grad_as_megatrons_ddp_accumulates_them(ours_class, megatron_class):
    """Two micro-batches: ``main_grad`` holds megatron's accumulated gradients; nothing is added twice."""
    ours, theirs = same_weights(ours_class, megatron_class, skip_bias_add=False)
    give_main_grad(ours)
    give_main_grad(theirs)
    for micro_batch in range(2):
        x = torch.randn(5, 3, 16, generator=torch.Generator().manual_seed(micro_batch))
        x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        for layer, inputs in ((ours, x_ours), (theirs, x_theirs)):
            run(layer, inputs)
            for param in layer.parameters():
                ddp_hook(param)
        torch.testing.assert_close(x_ours.grad, x_theirs.grad, rtol=1e-5, atol=1e-6)
    assert ours.weight.grad_added_to_main_grad
    assert not theirs.weight.grad_added_to_main_grad
    for name in ("weight", "bias"):
        ours_grad, theirs_grad = getattr(ours, name).main_grad, getattr(theirs, name).main_grad
        assert theirs_grad.abs().sum() > 0
        torch.testing.assert_close(ours_grad, theirs_grad, rtol=1e-5, atol=1e-5)


def test_switched_off_weight_gradients_go_through_autograd(monkeypatch):
    ensure_model_parallel()
    monkeypatch.setenv(fused.WGRAD_SWITCH, "0")
    layer = build(FusedBiasColumnParallelLinear, False)
    give_main_grad(layer)
    run(layer, torch.randn(5, 3, 16))
    assert not layer.wgrad_into_main_grad
    assert layer.weight.grad is not None
    assert not layer.weight.grad_added_to_main_grad
    assert layer.weight.main_grad.abs().sum() == 0  # left to DDP's hook, as without this layer


def test_without_megatron_ddp_weight_gradients_go_through_autograd():
    """No ``main_grad`` (prediction, Lightning's strategies): ``weight.grad`` as with ``F.linear``."""
    ensure_model_parallel()
    layer = build(FusedBiasRowParallelLinear, False)
    assert layer.wgrad_into_main_grad
    run(layer, torch.randn(5, 3, 16))
    assert layer.weight.grad is not None
    assert layer.weight.grad.abs().sum() > 0
