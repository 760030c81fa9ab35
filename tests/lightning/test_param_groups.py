"""Lightning's strategies decay the same parameters as megatron's optimizer: biases and 1-D parameters are exempt."""

import pytest
import torch
from megatron.core.optimizer import OptimizerConfig, _get_param_groups

from bionemo.lightning import ensure_model_parallel, torch_optimizer_from_config
from support.tiny_gpt import make_module


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_weight_decay_groups_match_megatrons(kind):
    ensure_model_parallel(cuda=False)
    module = make_module()
    module.configure_model()
    model = module.module
    megatron = _get_param_groups([model], None, None, 1.0, 1e-3, 0.0, None, None)
    expected = {wd: {id(p) for g in megatron if g["wd_mult"] == wd for p in g["params"]} for wd in (0.0, 1.0)}
    assert expected[0.0]
    assert expected[1.0]  # both kinds occur in the model

    config = OptimizerConfig(optimizer=kind, lr=1e-3, weight_decay=0.1)
    optimizer = torch_optimizer_from_config(config, model.named_parameters())
    found = {
        wd: {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0.1 * wd for p in g["params"]}
        for wd in (0.0, 1.0)
    }
    assert found == expected
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))


def test_frozen_parameters_are_left_out():
    weight, bias = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2), requires_grad=False)
    optimizer = torch_optimizer_from_config(
        OptimizerConfig(optimizer="adam", weight_decay=0.1), [("w.weight", weight), ("w.bias", bias)]
    )
    assert [g["params"] for g in optimizer.param_groups] == [[weight]]
