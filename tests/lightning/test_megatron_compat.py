"""MegatronCompatCallback's work-arounds, with stand-in trainers (the real runs are in tests/gpu)."""

import sys
from types import SimpleNamespace

import pytest
import torch

from bionemo.lightning import MegatronCompatCallback
from bionemo.lightning._nemo import MegatronStrategy
from bionemo.lightning.workarounds import DISTRIBUTED_OPTIMIZER_STEP, MULTI_TENSOR_FOREACH, Patches
from bionemo.lightning.workarounds.modelopt_stand_ins import MODULE, modelopt_stand_ins


@pytest.fixture
def megatron_trainer():
    strategy = MegatronStrategy()
    strategy.data_sampler = SimpleNamespace(num_microbatches=4, output_log=True)
    loop = SimpleNamespace(return_predictions=False, _predictions=[[]])
    return SimpleNamespace(
        strategy=strategy, datamodule=None, limit_val_batches=2, num_sanity_val_steps=1, predict_loop=loop
    )


def test_int_validation_limits_become_steps_once(megatron_trainer):
    callback = MegatronCompatCallback()
    callback.on_fit_start(megatron_trainer, None)
    callback.on_fit_start(megatron_trainer, None)
    assert megatron_trainer.limit_val_batches == 8
    assert megatron_trainer.num_sanity_val_steps == 4


def test_fractional_limits_and_nemo_datamodules_are_left_alone(megatron_trainer):
    megatron_trainer.limit_val_batches = 0.5
    megatron_trainer.datamodule = SimpleNamespace(reconfigure_limit_batches=lambda: None)
    MegatronCompatCallback().on_fit_start(megatron_trainer, None)
    assert megatron_trainer.limit_val_batches == 0.5
    assert megatron_trainer.num_sanity_val_steps == 1


def test_predict_without_returned_predictions_keeps_nothing_and_returns_none(megatron_trainer):
    from lightning.pytorch.loops import prediction_loop

    original_move = vars(prediction_loop)["move_data_to_device"]
    callback = MegatronCompatCallback()
    loop = megatron_trainer.predict_loop
    callback.on_predict_start(megatron_trainer, None)
    assert megatron_trainer.strategy.data_sampler.output_log is False
    assert loop.return_predictions is True  # Lightning 2.4 needs it with the dataloader-iter fetcher
    move = vars(prediction_loop)["move_data_to_device"]
    for batch in range(3):
        # what the loop keeps after each step: nothing is copied to the host
        loop._predictions[0].append(move({"y": torch.full((2,), float(batch))}, torch.device("cpu")))
    assert loop._predictions == [[None, None, None]]
    callback.on_predict_epoch_end(megatron_trainer, None)
    assert loop._predictions == [[]]
    assert loop.return_predictions is False
    callback.remove()
    assert vars(prediction_loop)["move_data_to_device"] is original_move


def test_off_megatron_nothing_changes():
    loop = SimpleNamespace(return_predictions=False, _predictions=[[]])
    trainer = SimpleNamespace(strategy=object(), limit_val_batches=2, num_sanity_val_steps=1, predict_loop=loop)
    callback = MegatronCompatCallback()
    callback.on_fit_start(trainer, None)
    callback.on_predict_start(trainer, None)
    assert trainer.limit_val_batches == 2
    assert loop.return_predictions is False


def test_modelopt_stand_ins_only_when_nemo_llm_cannot_import(monkeypatch):
    for name in list(sys.modules):
        if name.startswith("nemo.collections.llm"):
            monkeypatch.delitem(sys.modules, name)
    before = set(sys.modules)
    try:
        try:
            import nemo.collections.llm.modelopt.model_utils  # noqa: F401

            importable = True
        except ImportError:
            importable = False
        with modelopt_stand_ins() as installed:
            assert installed is not importable
            from nemo.collections.llm.modelopt.model_utils import restore_modelopt_state, save_modelopt_state

            if installed:
                assert save_modelopt_state(None, "path") is None
                assert restore_modelopt_state(None, "path") is None
            with modelopt_stand_ins() as again:
                assert again is False
        if installed:
            assert MODULE not in sys.modules  # only for the duration of the block
    finally:
        for name in set(sys.modules) - before:
            if name.startswith("nemo.collections.llm"):
                del sys.modules[name]


def test_distributed_optimizer_loads_moments_around_a_shared_step():
    """megatron 0.15.3 copies every live state key from a checkpoint that has no 'step'."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    params = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(2))]
    adam = torch.optim.AdamW(params)
    shared_step = torch.tensor(60.0)  # what DistributedOptimizer.load_state_dict leaves in every state
    for p in params:
        adam.state[p] = {"step": shared_step, "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    model_params = [object(), object()]
    fake = SimpleNamespace(
        config=SimpleNamespace(use_precision_aware_optimizer_no_fp8_or_ds_fp8=False),
        model_param_group_index_map={model_params[0]: (0, 0), model_params[1]: (0, 1)},
        optimizer=adam,
    )
    loaded = [
        {key: torch.full((n,), value + i) for key, value in (("param", 1.0), ("exp_avg", 2.0), ("exp_avg_sq", 3.0))}
        for i, n in enumerate((4, 2))
    ]
    original = DistributedOptimizer._set_main_param_and_optimizer_states
    with Patches() as patches, torch.no_grad():  # as megatron's loaders call it
        assert DISTRIBUTED_OPTIMIZER_STEP.apply(patches)
        assert DISTRIBUTED_OPTIMIZER_STEP.apply(patches)
        assert len(patches) == 1  # idempotent
        for model_param, tensors in zip(model_params, loaded, strict=True):
            DistributedOptimizer._set_main_param_and_optimizer_states(fake, model_param, tensors)
    assert DistributedOptimizer._set_main_param_and_optimizer_states is original
    for i, p in enumerate(params):
        torch.testing.assert_close(p.detach(), torch.full_like(p, 1.0 + i))
        torch.testing.assert_close(adam.state[p]["exp_avg"], torch.full_like(p, 2.0 + i))
        torch.testing.assert_close(adam.state[p]["exp_avg_sq"], torch.full_like(p, 3.0 + i))
        assert adam.state[p]["step"].item() == 60.0
    assert adam.state[params[0]]["step"] is not adam.state[params[1]]["step"]
    for p in params:
        p.grad = torch.ones_like(p)
    adam.step()  # one step advances every parameter's own counter once
    assert [adam.state[p]["step"].item() for p in params] == [61.0, 61.0]


def test_multi_tensor_fallbacks_are_replaced_by_foreach_kernels_with_the_same_values():
    """megatron's per-tensor gradient norm / scale fallbacks, swapped for _foreach kernels."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as megatron_optimizer

    from bionemo.lightning.workarounds.multi_tensor_foreach import foreach_l2_norm, foreach_scale

    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(shape, generator=gen) for shape in ((3, 5), (7,), (2, 2, 2))]
    flag = torch.zeros(1, dtype=torch.int)
    norm, per_tensor = foreach_l2_norm(2048 * 32, flag, [grads], False)
    reference = torch.cat([g.flatten() for g in grads]).double().pow(2).sum().sqrt()
    assert norm.shape == (1,)
    assert norm.dtype == torch.float32
    assert per_tensor is None
    torch.testing.assert_close(norm.double(), reference.reshape(1))
    assert foreach_l2_norm(2048 * 32, flag, [[]], False)[0].tolist() == [0.0]
    bf16 = [g.bfloat16() for g in grads]  # norms of low-precision grads accumulate in fp32
    torch.testing.assert_close(
        foreach_l2_norm(0, flag, [bf16], False)[0], torch.cat([g.float().flatten() for g in bf16]).norm().reshape(1)
    )

    for scale in (0.25, 1.0):  # out of place, as megatron's fallback does it (1.0: main -> model param copy)
        ours, theirs = [torch.empty_like(g).bfloat16() for g in grads], [torch.empty_like(g).bfloat16() for g in grads]
        foreach_scale(0, flag, [grads, ours], scale)
        utils.local_multi_tensor_scale(0, flag, [grads, theirs], scale)
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    in_place = [g.clone() for g in grads]  # grad clipping scales the gradients themselves
    foreach_scale(0, flag, [in_place, in_place], 0.5)
    for a, g in zip(in_place, grads, strict=True):
        torch.testing.assert_close(a, g * 0.5, rtol=0, atol=0)

    saved = (clip_grads.l2_norm_impl, clip_grads.multi_tensor_scale_impl, megatron_optimizer.multi_tensor_scale_impl)
    assert clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm  # no Apex / TE on this machine
    with Patches() as patches:
        assert MULTI_TENSOR_FOREACH.apply(patches)
        assert MULTI_TENSOR_FOREACH.apply(patches)
        assert len(patches) == 3  # idempotent
        assert clip_grads.l2_norm_impl is foreach_l2_norm
        assert clip_grads.multi_tensor_scale_impl is megatron_optimizer.multi_tensor_scale_impl is foreach_scale
    assert (
        clip_grads.l2_norm_impl,
        clip_grads.multi_tensor_scale_impl,
        megatron_optimizer.multi_tensor_scale_impl,
    ) == saved
