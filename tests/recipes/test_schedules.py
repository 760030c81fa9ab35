"""WarmupCosine: the closed-form factors, per-group ``lr_mult`` through a real AdamW + LambdaLR, and its checks."""

import math

import pytest
import torch

from bionemo.recipes.schedules import WarmupCosine


def _closed_form(step: int, max_steps: int, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return step / warmup
    done = min(1.0, (step - warmup) / (max_steps - warmup))
    return min_ratio + (1 - min_ratio) * (1 + math.cos(math.pi * done)) / 2


@pytest.mark.parametrize("min_ratio", [0.0, 0.1])
def test_factors_at_start_end_of_warmup_middle_and_end(min_ratio):
    schedule = WarmupCosine(max_steps=110, warmup_steps=10, min_ratio=min_ratio)
    assert schedule.factor(0) == 0.0
    assert schedule.factor(5) == pytest.approx(0.5)
    assert schedule.factor(10) == pytest.approx(1.0)  # the peak, at the end of warm-up
    assert schedule.factor(60) == pytest.approx(min_ratio + (1 - min_ratio) * 0.5)  # half way through the decay
    assert schedule.factor(110) == pytest.approx(min_ratio)
    assert schedule.factor(500) == pytest.approx(min_ratio)  # stays at the floor past max_steps
    for step in range(0, 120, 7):
        assert schedule.factor(step) == pytest.approx(_closed_form(step, 110, 10, min_ratio)), step


def test_no_warmup_starts_at_the_peak_and_warmup_to_the_end_never_decays():
    assert WarmupCosine(max_steps=4).factor(0) == 1.0
    assert WarmupCosine(max_steps=4).factor(2) == pytest.approx(0.5)
    whole = WarmupCosine(max_steps=4, warmup_steps=4)
    assert [whole.factor(t) for t in range(5)] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])


def test_each_group_gets_its_lr_times_the_factor_times_its_lr_mult():
    torch.manual_seed(0)
    encoder, head = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
    groups = [
        {"params": [encoder.weight], "lr": 1e-3, "lr_mult": 1.0},
        {"params": [encoder.bias], "lr": 1e-3},  # no lr_mult: 1
        {"params": list(head.parameters()), "lr": 1e-3, "lr_mult": 10.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=1e-3)
    schedule = WarmupCosine(max_steps=12, warmup_steps=3, min_ratio=0.05)
    out = schedule(None, optimizer)
    assert out["optimizer"] is optimizer
    assert {k: v for k, v in out["lr_scheduler"].items() if k != "scheduler"} == {"interval": "step", "frequency": 1}
    scheduler = out["lr_scheduler"]["scheduler"]
    assert isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR)
    x = torch.randn(5, 3)
    for k in range(15):
        expected = [1e-3 * schedule.factor(k) * mult for mult in (1.0, 1.0, 10.0)]
        assert [g["lr"] for g in optimizer.param_groups] == pytest.approx(expected, rel=1e-12, abs=0.0), k
        head(encoder(x)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()


def test_the_first_optimizer_step_of_a_warmup_moves_nothing():
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.AdamW([{"params": [param], "lr_mult": 5.0}], lr=1.0, weight_decay=0.0)
    scheduler = WarmupCosine(max_steps=4, warmup_steps=2)(None, optimizer)["lr_scheduler"]["scheduler"]
    param.sum().backward()
    optimizer.step()
    assert torch.equal(param.detach(), torch.ones(2))  # factor(0) = 0
    scheduler.step()
    optimizer.step()
    assert torch.allclose(param.detach(), torch.full((2,), 1.0 - 1.0 * 0.5 * 5.0), atol=1e-6)  # Adam's step is lr


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_steps": 0}, "max_steps"),
        ({"max_steps": -3}, "max_steps"),
        ({"max_steps": 10, "warmup_steps": -1}, "warmup_steps"),
        ({"max_steps": 10, "warmup_steps": 11}, "warmup_steps"),
        ({"max_steps": 10, "min_ratio": -0.1}, "min_ratio"),
        ({"max_steps": 10, "min_ratio": 1.5}, "min_ratio"),
    ],
)
def test_invalid_arguments_name_the_field_and_the_value(kwargs, field):
    with pytest.raises(ValueError, match=field) as raised:
        WarmupCosine(**kwargs)
    assert str(kwargs[field]) in str(raised.value)
