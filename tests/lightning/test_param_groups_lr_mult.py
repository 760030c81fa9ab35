"""``scale_lr_cond`` / ``lr_mult`` on Lightning's strategies: the same groups as megatron-core's optimizer builds.

megatron's ``_get_param_groups`` all-gathers the group keys over ``torch.distributed``'s world, so it needs a
process group: ``ensure_model_parallel(cuda=False)`` starts a one-rank gloo group on CPU, as the weight-decay test
beside this one does.
"""

import pytest
import torch
from megatron.core.optimizer import OptimizerConfig, _get_param_groups

from bionemo.lightning import ensure_model_parallel, torch_optimizer_from_config
from bionemo.lightning.optimizer import megatron_param_groups
from support.tiny_gpt import make_module


def _second_layer(name: str, _param: torch.nn.Parameter) -> bool:
    return ".layers.1." in f".{name}"


def _gpt() -> torch.nn.Module:
    ensure_model_parallel(cuda=False)
    module = make_module()
    module.configure_model()
    assert module.module is not None
    return module.module


def _membership(groups, lr: float, wd: float) -> dict[tuple[float, float], set[int]]:
    """Parameter ids by (weight-decay multiple, lr multiple) of torch optimizer groups."""
    out: dict[tuple[float, float], set[int]] = {}
    for g in groups:
        key = (g["weight_decay"] / wd, g.get("lr_mult", 1.0))
        out.setdefault(key, set()).update(id(p) for p in g["params"])
    return out


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_scaled_groups_match_megatrons_for_the_same_named_parameters(kind):
    model = _gpt()
    megatron = _get_param_groups([model], None, _second_layer, 5.0, 1e-3, 0.0, None, None)
    expected: dict[tuple[float, float], set[int]] = {}
    for g in megatron:
        expected.setdefault((g["wd_mult"], g["lr_mult"]), set()).update(id(p) for p in g["params"])
    assert sorted(expected) == [(0.0, 1.0), (0.0, 5.0), (1.0, 1.0), (1.0, 5.0)]  # all four kinds occur

    config = OptimizerConfig(optimizer=kind, lr=1e-3, weight_decay=0.1)
    optimizer = torch_optimizer_from_config(config, model.named_parameters(), _second_layer, 5.0)
    assert _membership(optimizer.param_groups, 1e-3, 0.1) == expected
    assert all(g["lr"] == 1e-3 for g in optimizer.param_groups)  # the multiple is applied by the schedule
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))


def test_names_under_a_wrapper_prefix_group_as_megatrons_unprefixed_names():
    """The step runner passes ``module.named_parameters()`` (``module.`` prefix); membership stays megatron's."""
    model = _gpt()
    wrapper = torch.nn.Module()
    wrapper.module = model
    megatron = _get_param_groups([model], None, _second_layer, 3.0, 1e-3, 0.0, None, None)
    expected: dict[tuple[float, float], set[int]] = {}
    for g in megatron:
        expected.setdefault((g["wd_mult"], g["lr_mult"]), set()).update(id(p) for p in g["params"])
    groups = megatron_param_groups(wrapper.named_parameters(), 0.1, _second_layer, 3.0)
    assert _membership(groups, 1e-3, 0.1) == expected


def test_weight_decay_rule_is_unchanged_by_scaling():
    named = {
        "encoder.weight": torch.nn.Parameter(torch.ones(2, 2)),
        "encoder.bias": torch.nn.Parameter(torch.ones(2)),
        "norm.weight": torch.nn.Parameter(torch.ones(2)),  # 1-D: exempt though not a bias
        "head.weight": torch.nn.Parameter(torch.ones(1, 2)),
        "head.bias": torch.nn.Parameter(torch.ones(1)),
        "head.frozen": torch.nn.Parameter(torch.ones(2, 2), requires_grad=False),
    }
    by_id = {id(p): n for n, p in named.items()}

    def summary(groups):
        return [(g["weight_decay"], g.get("lr_mult"), [by_id[id(p)] for p in g["params"]]) for g in groups]

    def head(name, _param):
        return name.startswith("head.")

    assert summary(megatron_param_groups(named.items(), 0.05)) == [
        (0.05, None, ["encoder.weight", "head.weight"]),
        (0.0, None, ["encoder.bias", "norm.weight", "head.bias"]),
    ]
    assert summary(megatron_param_groups(named.items(), 0.05, head, 10.0)) == [
        (0.05, 1.0, ["encoder.weight"]),
        (0.0, 1.0, ["encoder.bias", "norm.weight"]),
        (0.05, 10.0, ["head.weight"]),
        (0.0, 10.0, ["head.bias"]),
    ]
    # a condition that holds nowhere leaves two groups, both at lr_mult 1 (megatron's groups carry it then too)
    assert summary(megatron_param_groups(named.items(), 0.05, lambda n, p: False, 10.0)) == [
        (0.05, 1.0, ["encoder.weight", "head.weight"]),
        (0.0, 1.0, ["encoder.bias", "norm.weight", "head.bias"]),
    ]


def test_plain_parameters_are_never_scaled():
    """Without names ``scale_lr_cond`` cannot be asked: one decaying group at lr_mult 1."""
    params = [torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))]
    groups = megatron_param_groups(params, 0.1, lambda n, p: True, 10.0)
    assert [(g["weight_decay"], g["lr_mult"], len(g["params"])) for g in groups] == [(0.1, 1.0, 2)]


def test_an_adamw_step_moves_scaled_parameters_by_their_multiple():
    """Through the groups: after one AdamW step (each moves by about its lr) the head moved ``lr_mult`` times more."""
    encoder, head = torch.nn.Parameter(torch.zeros(4, 4)), torch.nn.Parameter(torch.zeros(1, 4))
    named = [("encoder.weight", encoder), ("head.weight", head)]
    optimizer = torch_optimizer_from_config(
        OptimizerConfig(optimizer="adam", lr=1e-2, weight_decay=0.0), named, lambda n, p: n.startswith("head."), 4.0
    )
    for group in optimizer.param_groups:  # what a schedule does with the multiple (WarmupCosine at factor 1)
        group["lr"] *= group["lr_mult"]
    (encoder.sum() + head.sum()).backward()
    optimizer.step()
    torch.testing.assert_close(encoder.detach(), torch.full((4, 4), -1e-2), rtol=1e-4, atol=0)
    torch.testing.assert_close(head.detach(), torch.full((1, 4), -4e-2), rtol=1e-4, atol=0)
