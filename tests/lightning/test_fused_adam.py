"""The fused_adam speed-up: torch Adam inside megatron's / NeMo's optimizer wrappers switched to the fused kernel.

On a CPU machine the CUDA-only rule is lifted (``_can_fuse`` patched) so that torch's fused CPU AdamW runs the
same switch; ``tests/gpu/test_megatron_strategy.py`` checks it on a GPU run, through a checkpoint resume.
"""

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from bionemo.lightning import MegatronCompatCallback, megatron_compat
from bionemo.lightning.workarounds import fused_adam
from bionemo.lightning.workarounds.fused_adam import fuse_adam
from support.tiny_gpt import BigramDataset, make_module
from support.trainers import cpu_trainer


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape, generator=gen)) for shape in ((7, 5), (5,), (3, 3, 2))]


def _train(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, steps: range, fuse_at: int | None):
    for step in steps:
        if step == fuse_at:
            # as megatron and NeMo wrap it
            assert fuse_adam([SimpleNamespace(mcore_optimizer=SimpleNamespace(optimizer=optimizer))]) == 1
        gen = torch.Generator().manual_seed(100 + step)
        for param in params:
            param.grad = torch.randn(param.shape, generator=gen)
        optimizer.step()


@pytest.fixture
def cpu_may_fuse(monkeypatch):
    monkeypatch.setattr(fused_adam, "_can_fuse", lambda group: not group.get("fused") and bool(group["params"]))


def test_cpu_parameters_stay_unfused():
    params = _params()
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    _train(params, optimizer, range(2), fuse_at=None)
    assert fuse_adam([optimizer]) == 0
    assert optimizer.param_groups[0]["fused"] is None
    assert all(optimizer.state[p]["step"].dtype == torch.float32 for p in params)


def test_switching_mid_run_continues_the_same_adamw(cpu_may_fuse):
    reference_params, params = _params(), _params()
    reference = torch.optim.AdamW(reference_params, lr=1e-2, weight_decay=0.1, foreach=True)
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=True)
    _train(reference_params, reference, range(6), fuse_at=None)
    _train(params, optimizer, range(6), fuse_at=3)

    group = optimizer.param_groups[0]
    assert (group["fused"], group["foreach"]) == (True, False)
    steps = [optimizer.state[p]["step"] for p in params]
    assert [float(s) for s in steps] == [6.0] * 3
    assert len({id(s) for s in steps}) == 3  # each parameter advances its own counter
    for mine, theirs in zip(params, reference_params, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-6)
    assert fuse_adam([optimizer]) == 0  # fused already


def test_a_shared_step_tensor_becomes_one_per_parameter(cpu_may_fuse):
    """megatron's distributed optimizer restores one ``step`` tensor for all parameters of a resumed run."""
    params = _params()
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    _train(params, optimizer, range(1), fuse_at=None)
    shared = torch.tensor(4.0)
    for param in params:
        optimizer.state[param]["step"] = shared
    fuse_adam([optimizer])
    _train(params, optimizer, range(1), fuse_at=None)
    assert [float(optimizer.state[p]["step"]) for p in params] == [5.0] * 3
    assert float(shared) == 4.0


def _fit(callbacks) -> torch.optim.Optimizer:
    trainer = cpu_trainer(callbacks, max_steps=2)
    loader = DataLoader(BigramDataset(16, 16, 32, seed=1), batch_size=4)
    trainer.fit(make_module(), train_dataloaders=loader)
    return trainer.optimizers[0]


@pytest.mark.parametrize("skip", [(), ("fused_adam",)], ids=["applied", "skipped"])
def test_the_callback_fuses_at_train_start_under_megatron(monkeypatch, cpu_may_fuse, skip):
    monkeypatch.setattr(megatron_compat, "_is_megatron", lambda trainer: True)
    optimizer = _fit([MegatronCompatCallback(skip=skip)])
    assert bool(optimizer.param_groups[0]["fused"]) is not skip


def test_off_megatron_nothing_is_fused(cpu_may_fuse):
    assert not _fit([MegatronCompatCallback()]).param_groups[0]["fused"]
