"""LoRA on megatron parallel linears computes what peft's LoRA computes, merges exactly, and agrees across TP sizes."""

import math
from typing import Any

import pytest
import torch

from bionemo.layers import (
    LoRAConfig,
    LoRALinear,
    LoRATarget,
    apply_lora,
    load_lora_state_dict,
    lora_modules,
    lora_state_dict,
    merge_lora,
)
from support.distributed import run_distributed
from support.lora_workers import ALPHA, RANK, lora_case, parallel_linear, tp_worker, whole_tensors
from support.megatron_ddp import ddp_hook, give_main_grad

CASES = [("column", False, False), ("column", True, False), ("column", False, True), ("row", False, False),
         ("row", True, False), ("row", False, True)]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _tp1():
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()


def peft_reference(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """peft 0.21's LoRA on a torch Linear with the same base weights and factors: output and gradients."""
    from peft import LoraConfig, get_peft_model

    model = torch.nn.ModuleDict({"proj": torch.nn.Linear(tensors["weight"].shape[1], tensors["weight"].shape[0])})
    with torch.no_grad():
        model["proj"].weight.copy_(tensors["weight"])
        model["proj"].bias.copy_(tensors["bias"])
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=["proj"])
    layer: Any = get_peft_model(model, config).base_model.model.get_submodule("proj")
    with torch.no_grad():
        layer.lora_A["default"].weight.copy_(tensors["A"])
        layer.lora_B["default"].weight.copy_(tensors["B"])
    assert not layer.base_layer.weight.requires_grad  # peft freezes the base layer
    x = tensors["x"].clone().requires_grad_()
    output = layer(x)
    output.backward(tensors["grad"])
    return {
        "output": output.detach(),
        "x_grad": x.grad,
        "A_grad": layer.lora_A["default"].weight.grad,
        "B_grad": layer.lora_B["default"].weight.grad,
    }


@pytest.mark.parametrize(("kind", "fused", "skip_bias_add"), CASES)
def test_tp1_matches_peft_and_merges_exactly(kind, fused, skip_bias_add):
    ours, reference = lora_case(kind, fused, skip_bias_add), peft_reference(whole_tensors())
    for key in ("output", "x_grad", "A_grad", "B_grad"):
        torch.testing.assert_close(ours[key], reference[key], rtol=0, atol=1e-5, msg=key)
    assert ours["base_grads"] == [None, None]
    # merge_lora: W + alpha / r * B @ A, and the merged plain layer computes what the adapted one did
    tensors = whole_tensors()
    expected = tensors["weight"] + ALPHA / RANK * tensors["B"] @ tensors["A"]
    torch.testing.assert_close(ours["merged_weight"], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours["merged_output"], ours["output"], rtol=0, atol=1e-5)


def adapted_layer(kind: str, fused: bool) -> LoRALinear:
    """An adapted layer holding :func:`whole_tensors`' weights and factors, its base frozen (TP1)."""
    tensors = whole_tensors()
    layer = LoRALinear(parallel_linear(kind, fused, False, tensors), LoRAConfig(rank=RANK, alpha=ALPHA))
    layer.load_whole_factors(tensors["A"], tensors["B"])
    layer.base.requires_grad_(False)
    return layer


@pytest.mark.parametrize(("kind", "fused"), [("column", True), ("row", False)])
def test_factor_gradients_go_into_main_grad_as_megatrons_ddp_accumulates_them(kind, fused):
    """Two micro-batches under megatron's DDP: the factors' ``main_grad`` holds both batches' peft gradients."""
    layer = adapted_layer(kind, fused)
    give_main_grad(layer.lora_A)
    give_main_grad(layer.lora_B)
    tensors = whole_tensors()
    for _ in range(2):
        output, _bias = layer(tensors["x"].clone().requires_grad_())
        output.backward(tensors["grad"])
        for factor in (layer.lora_A.weight, layer.lora_B.weight):
            ddp_hook(factor)
    reference = peft_reference(tensors)
    for name in ("A", "B"):
        factor = getattr(layer, f"lora_{name}").weight
        assert factor.grad_added_to_main_grad, name
        torch.testing.assert_close(factor.main_grad, 2 * reference[f"{name}_grad"], rtol=0, atol=1e-5, msg=name)


def test_the_update_is_one_autograd_node_at_tp1_and_autograd_s_under_autocast():
    """Without autocast the update is one node (gradients as peft's, checked above); under autocast, autograd's ops
    (the fused node would see the autocast dtypes in its forward only) and the gradients still reach the factors."""
    layer, tensors = adapted_layer("column", True), whole_tensors()
    x = tensors["x"].clone().requires_grad_()
    output, _bias = layer(x)
    assert type(output.grad_fn).__name__ == "_LowRankUpdateBackward"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output, _bias = layer(x)
    assert type(output.grad_fn).__name__ != "_LowRankUpdateBackward"
    output.float().backward(tensors["grad"])
    reference = peft_reference(tensors)
    for name in ("A", "B"):
        grad = getattr(layer, f"lora_{name}").weight.grad
        torch.testing.assert_close(grad, reference[f"{name}_grad"], rtol=0.05, atol=0.05, msg=name)


def test_an_input_without_gradient_gets_none_and_the_factors_still_train():
    """The first layer's input (a frozen embedding's) needs no gradient: the node skips that GEMM."""
    layer, tensors = adapted_layer("row", True), whole_tensors()
    output, _bias = layer(tensors["x"])
    output.backward(tensors["grad"])
    reference = peft_reference(tensors)
    for name in ("A", "B"):
        grad = getattr(layer, f"lora_{name}").weight.grad
        torch.testing.assert_close(grad, reference[f"{name}_grad"], rtol=0, atol=1e-5, msg=name)


def test_initialization_is_peft_s_kaiming_uniform_a_and_zero_b():
    torch.manual_seed(7)
    layer = LoRALinear(parallel_linear("row", False, False, whole_tensors()), LoRAConfig(rank=RANK, alpha=ALPHA))
    torch.manual_seed(7)
    expected = torch.nn.init.kaiming_uniform_(torch.empty(RANK, layer.base.input_size), a=math.sqrt(5))
    assert torch.equal(layer.lora_A.weight.detach(), expected)
    assert torch.equal(layer.lora_B.weight.detach(), torch.zeros(layer.base.output_size, RANK))
    assert layer.scale == ALPHA / RANK


@pytest.mark.multiprocess
def test_tp2_equals_tp1_for_column_and_row_parallel_bases():
    results = run_distributed(tp_worker, 2)
    for kind in ("column", "row"):
        for fused in (False, True):
            tp1 = lora_case(kind, fused)
            for rank, result in enumerate(results):
                tp2 = result[(kind, fused)]
                for key in ("output", "x_grad", "A_grad", "B_grad", "merged_output", "merged_weight"):
                    torch.testing.assert_close(tp2[key], tp1[key], rtol=0, atol=1e-5, msg=f"{kind} {key} {rank}")
                # the same seed draws the same whole A at TP2 as at TP1
                assert torch.equal(tp2["drawn_A"], tp1["drawn_A"]), (kind, rank)
                assert torch.equal(tp2["drawn_B"], torch.zeros_like(tp1["drawn_B"]))
                assert tp2["base_grads"] == [None, None]
    assert "rank=3 with tensor parallelism 2: valid is a multiple of 2" in results[0]["rank_error"]


# ---- a tiny ESM-2 model -------------------------------------------------------------------------------------------

HIDDEN, HEADS, LAYERS, FFN = 32, 4, 2, 64


def esm2_model(seed: int = 0):
    from bionemo.esm2.model import ESM2Config

    torch.manual_seed(seed)
    config = ESM2Config(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_hidden_size=FFN, seq_length=20
    )
    return config.configure_model().eval()


def esm2_inputs():
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(4, 29, (3, 12), generator=gen)
    valid = torch.arange(12)[None, :] < torch.tensor([12, 9, 7])[:, None]
    return tokens, valid


def peft_trainable(r: int, target_modules: str) -> int:
    """Trainable parameters peft reports for LoRA on a Hugging Face ESM-2 of the same shape."""
    from peft import LoraConfig, get_peft_model

    from support.hf_esm import random_hf_esm

    hf = random_hf_esm(hidden=HIDDEN, heads=HEADS, layers=LAYERS, ffn=FFN)
    peft_model = get_peft_model(hf, LoraConfig(r=r, lora_alpha=2 * r, target_modules=target_modules))
    return peft_model.get_nb_trainable_parameters()[0]


@pytest.mark.parametrize(
    "targets",
    [frozenset(LoRATarget), frozenset({LoRATarget.QKV}), frozenset({LoRATarget.PROJ, LoRATarget.FC2})],
    ids=["all", "qkv", "proj+fc2"],
)
def test_apply_lora_on_esm2_adapts_the_targets_and_changes_nothing_at_init(targets):
    from bionemo.layers.fused_bias_linear import FusedBiasColumnParallelLinear, FusedBiasRowParallelLinear

    model = esm2_model()
    tokens, valid = esm2_inputs()
    with torch.no_grad():
        before = model(tokens, valid)
    base_keys = set(model.state_dict())
    base_state = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    names = apply_lora(model, LoRAConfig(rank=4, alpha=8, dropout=0.1, targets=targets))
    expected = [f"decoder.layers.{i}.{t.value}" for i in range(LAYERS) for t in LoRATarget if t in targets]
    assert sorted(names) == sorted(expected)
    assert all(isinstance(model.get_submodule(name), LoRALinear) for name in names)
    with torch.no_grad():
        assert torch.equal(model(tokens, valid), before)  # B = 0 (and dropout off in eval)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{name}.{factor}.weight" for name in names for factor in ("lora_A", "lora_B")}
    # the base's keys stay where they were; a base state dict loads into the adapted model
    lora_keys = set(lora_state_dict(model))
    assert set(model.state_dict()) == base_keys | lora_keys
    result = model.load_state_dict(base_state, strict=False)
    assert set(result.missing_keys) == lora_keys
    assert result.unexpected_keys == []
    # merge_lora puts the plain base layers back
    assert sorted(merge_lora(model)) == sorted(names)
    for name in names:
        module = model.get_submodule(name)
        column = name.endswith(("linear_qkv", "linear_fc1"))
        assert type(module) is (FusedBiasColumnParallelLinear if column else FusedBiasRowParallelLinear)
    assert set(model.state_dict()) == base_keys


def test_trainable_parameters_match_peft_on_the_hugging_face_model():
    """Same count as peft for proj / fc1 / fc2 (one adapter each on both sides). Hugging Face's query, key and value
    are three linears (peft: three A [r, h] and three B [h, r]); megatron's fused linear_qkv gets one A [r, h] and
    one B [3h, r]: the same update rank per projection from a shared A, so 2 * r * h fewer per layer."""
    r = 4
    model = esm2_model()
    apply_lora(model, LoRAConfig(rank=r, alpha=8))
    ours = sum(p.numel() for p in model.parameters() if p.requires_grad)
    others = peft_trainable(r, r".*layer\.\d+\.(attention\.output\.dense|intermediate\.dense|output\.dense)")
    qkv = peft_trainable(r, r".*layer\.\d+\.attention\.self\.(query|key|value)")
    assert qkv == LAYERS * 3 * (r * HIDDEN + HIDDEN * r)
    assert ours == others + qkv - LAYERS * 2 * r * HIDDEN
    model = esm2_model()
    apply_lora(model, LoRAConfig(rank=r, targets=frozenset({LoRATarget.PROJ, LoRATarget.FC1, LoRATarget.FC2})))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == others


def test_lora_state_dict_round_trip_and_merge_on_esm2():
    tokens, valid = esm2_inputs()
    model = esm2_model()
    apply_lora(model, LoRAConfig(rank=4, alpha=8))
    gen = torch.Generator().manual_seed(3)
    state = {k: 0.1 * torch.randn(v.shape, generator=gen) for k, v in lora_state_dict(model).items()}
    load_lora_state_dict(model, state)
    saved = lora_state_dict(model)
    assert saved.keys() == state.keys()
    assert all(torch.equal(saved[k], state[k]) for k in state)
    with torch.no_grad():
        adapted = model(tokens, valid)
        assert not torch.equal(adapted, esm2_model()(tokens, valid))  # the update changes the output
    # the whole adapted state (base + adapters) loads into another adapted model
    other = esm2_model(seed=1)
    apply_lora(other, LoRAConfig(rank=4, alpha=8))
    other.load_state_dict(model.state_dict())
    merge_lora(model)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, valid), adapted, rtol=0, atol=1e-5)
        torch.testing.assert_close(other(tokens, valid), adapted, rtol=0, atol=1e-5)
    sharded = other.sharded_state_dict()
    assert {k for k in sharded if "lora_" in k} == set(state)
    a_key = "decoder.layers.0.self_attention.linear_proj.lora_A.weight"
    assert sharded[a_key].data.shape == state[a_key].shape


def gelu_left_in_the_mlp(model) -> None:
    """Undo :func:`apply_lora`'s move of each MLP's GELU into its fc2 (the reference: autograd's ops throughout)."""
    for name, module in lora_modules(model).items():
        if module.activation is not None:
            model.get_submodule(name.rpartition(".")[0]).activation_func = module.activation
            module.activation = None


def saved_bytes_and_gradients(model, tokens, valid):
    """Bytes autograd keeps for the backward of one forward, and every trainable parameter's gradient."""
    saved: dict[int, int] = {}

    def keep(tensor):
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        output = model(tokens, valid)
    output.float().pow(2).mean().backward()
    return sum(saved.values()), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_the_gelu_moved_into_fc2_trains_as_the_mlp_s_own_and_keeps_less_for_the_backward():
    tokens, valid = esm2_inputs()
    moved, reference = esm2_model(), esm2_model()
    for model in (moved, reference):
        apply_lora(model, LoRAConfig(rank=4, alpha=8))
        gen = torch.Generator().manual_seed(3)
        load_lora_state_dict(
            model, {k: 0.1 * torch.randn(v.shape, generator=gen) for k, v in lora_state_dict(model).items()}
        )
    fc2 = moved.decoder.layers[0].mlp.linear_fc2
    assert fc2.activation is torch.nn.functional.gelu
    assert moved.decoder.layers[0].mlp.activation_func is not torch.nn.functional.gelu
    gelu_left_in_the_mlp(reference)
    moved_bytes, moved_grads = saved_bytes_and_gradients(moved, tokens, valid)
    reference_bytes, reference_grads = saved_bytes_and_gradients(reference, tokens, valid)
    assert moved_grads.keys() == reference_grads.keys()
    for name, grad in moved_grads.items():
        torch.testing.assert_close(grad, reference_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    # per layer the GELU's output [tokens, ffn] in fp32 is no longer kept
    assert reference_bytes - moved_bytes >= LAYERS * tokens.numel() * FFN * 4
    merge_lora(moved)
    assert moved.decoder.layers[0].mlp.activation_func is torch.nn.functional.gelu


# ---- errors -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rank": 0}, "rank=0: valid is an integer >= 1"),
        ({"rank": 2.5}, "rank=2.5: valid is an integer >= 1"),
        ({"alpha": 0}, "alpha=0: valid is a finite number > 0"),
        ({"alpha": math.inf}, "alpha=inf: valid is a finite number > 0"),
        ({"dropout": 1.0}, "dropout=1.0: valid is a number in [0, 1)"),
        ({"dropout": -0.1}, "dropout=-0.1: valid is a number in [0, 1)"),
        ({"targets": frozenset()}, "targets=frozenset(): valid is a non-empty set of qkv (self_attention.linear_qkv)"),
        ({"targets": "qkv"}, "targets='qkv': valid is a non-empty set of qkv"),
        (
            {"targets": frozenset({"query"})},
            "targets: 'query' is no LoRA target; valid: qkv (self_attention.linear_qkv),",
        ),
    ],
)
def test_config_rejects_bad_values(changes, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        LoRAConfig(**changes)


def test_config_takes_target_values_as_strings():
    config = LoRAConfig(targets=frozenset({"mlp.linear_fc1"}))
    assert config.targets == frozenset({LoRATarget.FC1})


def test_apply_lora_refuses_models_without_targets_and_adapted_models():
    with pytest.raises(ValueError, match=r"no module of Linear is named \*\.\{mlp\.linear_fc1\}"):
        apply_lora(torch.nn.Linear(2, 2), LoRAConfig(targets=frozenset({LoRATarget.FC1})))
    model = esm2_model()
    apply_lora(model, LoRAConfig(rank=2))
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        apply_lora(model, LoRAConfig(rank=2))
    with pytest.raises(TypeError, match="got Linear"):
        LoRALinear(torch.nn.Linear(2, 2), LoRAConfig())
    state = lora_state_dict(model)
    state["head.lora_A.weight"] = state.pop("decoder.layers.1.mlp.linear_fc2.lora_B.weight")
    with pytest.raises(ValueError, match=r"missing keys \['decoder\.layers\.1\.mlp\.linear_fc2\.lora_B\.weight'\], "
                       r"unexpected keys \['head\.lora_A\.weight'\]"):  # fmt: skip
        load_lora_state_dict(model, state)
    state = lora_state_dict(model)
    state["decoder.layers.0.mlp.linear_fc1.lora_B.weight"] = torch.zeros(FFN + 1, 2)
    with pytest.raises(
        ValueError, match=r"^decoder\.layers\.0\.mlp\.linear_fc1\.lora_B\.weight of shape \(65, 2\): valid is \(64, 2\)"
    ):
        load_lora_state_dict(model, state)
