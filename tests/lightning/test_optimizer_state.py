"""init_adam_state: Adam's lazily made state created up front, through megatron's and NeMo's wrappers."""

from types import SimpleNamespace

import pytest
import torch
from nemo.core.optim.mcore_optim import McoreDistributedOptimizer

from bionemo.lightning import init_adam_state


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in [(3, 4), (4,), (2, 2, 2)]]


def _train(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: int = 3) -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator)
        optimizer.step()


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
        (torch.optim.Adam, {"lr": 1e-2}),
        (torch.optim.Adam, {"lr": 1e-2, "amsgrad": True}),
    ],
)
def test_training_after_eager_state_is_unchanged(cls, kwargs):
    lazy_params, eager_params = _params(), _params()
    lazy, eager = cls(lazy_params, **kwargs), cls(eager_params, **kwargs)
    init_adam_state(eager)
    assert all(eager.state[p]["step"].item() == 0 for p in eager_params)
    reference_state = cls(_params(), **kwargs)
    _train(reference_state, list(reference_state.param_groups[0]["params"]), steps=1)
    for state in eager.state.values():  # the keys and dtypes Adam's own first step makes
        reference = next(iter(reference_state.state.values()))
        assert sorted(state) == sorted(reference)
        assert {k: v.dtype for k, v in state.items()} == {k: v.dtype for k, v in reference.items()}
    _train(lazy, lazy_params)
    _train(eager, eager_params)
    for a, b in zip(lazy_params, eager_params, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(lazy_params, eager_params, strict=True):
        for key in lazy.state[a]:
            torch.testing.assert_close(lazy.state[a][key], eager.state[b][key], rtol=0, atol=0)


def test_step_dtype_follows_a_float64_default():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        params = _params()
        optimizer = torch.optim.Adam(params)
        init_adam_state(optimizer)
        reference = torch.optim.Adam(_params())
        _train(reference, list(reference.param_groups[0]["params"]), steps=1)
        assert optimizer.state[params[0]]["step"].dtype == next(iter(reference.state.values()))["step"].dtype
    finally:
        torch.set_default_dtype(previous)


def test_reaches_adam_inside_nemo_and_megatron_wrappers_and_keeps_existing_state():
    first, second = _params(0), _params(1)
    adam, sgd = torch.optim.AdamW(first, lr=1e-2), torch.optim.SGD(second, lr=0.1)
    # megatron's own wrappers need CUDA; these stand-ins have their attribute layout (the real stack is
    # exercised by the resume phase of tests/gpu/test_megatron_strategy.py)
    chained = SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=adam), SimpleNamespace(optimizer=sgd)])
    wrapped = McoreDistributedOptimizer(chained)
    _train(adam, first[:1], steps=2)  # one parameter already has state: it must be kept
    kept = {key: value.clone() for key, value in adam.state[first[0]].items()}
    init_adam_state(wrapped)
    assert kept["step"].item() == 2
    for key, value in kept.items():
        torch.testing.assert_close(adam.state[first[0]][key], value, rtol=0, atol=0)
    assert all(adam.state[p]["step"].item() == 0 for p in first[1:])
    # megatron's distributed optimizer (no Apex/TE) reads one step from every parameter's state
    assert len({s["step"].item() for s in adam.state_dict()["state"].values()}) == 2
    assert len(adam.state_dict()["state"]) == len(first)
    assert not sgd.state
