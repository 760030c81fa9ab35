"""Canaries: each fails when the upstream code a work-around depends on changes, or its bug is gone.

A failure here means: read the new upstream code, check whether the work-around is still needed and still
right, then update its ``verified`` versions and ``sources`` digests (or delete it).
"""

import sys
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from bionemo.lightning.workarounds import (
    DISTRIBUTED_OPTIMIZER_STEP,
    MODELOPT_STAND_INS,
    MULTI_TENSOR_FOREACH,
    STEP_WITHOUT_DISTILLATION_SHAPES,
    WORKAROUNDS,
)
from bionemo.lightning.workarounds.workaround import installed_version, source_digest
from support.iter_predictor import IterPredictor

SOURCES = [(w.name, target, digest) for w in WORKAROUNDS for target, digest in w.sources.items()]


@pytest.mark.parametrize("workaround", WORKAROUNDS, ids=lambda w: w.name)
def test_the_verified_versions_are_installed(workaround):
    installed = {name: installed_version(name) for name in workaround.verified}
    assert installed == dict(workaround.verified), f"{workaround.name}: re-verify it on {installed}"


@pytest.mark.parametrize(("name", "target", "digest"), SOURCES, ids=[f"{n}-{t.rsplit(':')[-1]}" for n, t, _ in SOURCES])
def test_the_upstream_source_is_the_verified_one(name, target, digest):
    assert source_digest(target) == digest, f"{name}: upstream {target} changed; re-verify the work-around"


def test_work_arounds_without_upstream_sources_patch_nothing():
    for workaround in WORKAROUNDS:
        if not workaround.sources:
            assert workaround.install is None, workaround.name


def test_names_are_unique_and_name_their_modules():
    names = [w.name for w in WORKAROUNDS]
    assert len(set(names)) == len(names)
    for workaround in WORKAROUNDS:
        assert f"bionemo.lightning.workarounds.{workaround.name}" in sys.modules


def _nemo_llm_importable() -> bool:
    try:
        import nemo.collections.llm.modelopt.model_utils  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(_nemo_llm_importable(), reason="nemo.collections.llm imports here (nemo_toolkit[nlp])")
def test_nemo_step_shapes_and_checkpoints_still_need_nemo_llm(monkeypatch):
    """What the distillation-shape and ModelOpt work-arounds avoid: an import that fails with nemo_toolkit[core]."""
    from bionemo.lightning._nemo import MegatronStep

    for name in list(sys.modules):
        if name.startswith("nemo.collections.llm"):
            monkeypatch.delitem(sys.modules, name)
    step = MegatronStep(pipeline=None, data=[], forward_step_func=None, forward_only=True)
    with pytest.raises(ImportError):
        _ = step.adjust_tensor_shapes_fn  # even forward-only, where the answer is None
    assert STEP_WITHOUT_DISTILLATION_SHAPES.sources
    assert MODELOPT_STAND_INS.sources


def test_megatron_step_fields_can_be_copied_into_the_replacement():
    from bionemo.lightning._nemo import MegatronStep
    from bionemo.lightning.workarounds.step_without_distillation_shapes import without_distillation_shapes

    step = MegatronStep(
        pipeline=None, data=[], forward_step_func=None, forward_only=True, micro_batch_size=3, seq_length=7
    )
    replaced = without_distillation_shapes(step)
    assert replaced.adjust_tensor_shapes_fn is None
    assert (replaced.micro_batch_size, replaced.seq_length, replaced.forward_only) == (3, 7, True)


def test_distributed_optimizer_still_copies_a_step_the_loaded_moments_lack():
    """megatron-core's loader fails with KeyError 'step' on torch Adam state without the work-around."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer._set_main_param_and_optimizer_states
    assert not getattr(original, "_bionemo_keeps_step", False), "run this canary without the work-around applied"
    param = torch.nn.Parameter(torch.zeros(2))
    adam = torch.optim.AdamW([param])
    adam.state[param] = {"step": torch.tensor(3.0), "exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}
    model_param = object()
    fake = SimpleNamespace(
        config=SimpleNamespace(use_precision_aware_optimizer_no_fp8_or_ds_fp8=False),
        model_param_group_index_map={model_param: (0, 0)},
        optimizer=adam,
    )
    loaded = {"param": torch.ones(2), "exp_avg": torch.ones(2), "exp_avg_sq": torch.ones(2)}
    with torch.no_grad(), pytest.raises(KeyError, match="step"):
        original(fake, model_param, loaded)
    assert DISTRIBUTED_OPTIMIZER_STEP.stages == {"fit"}


def test_megatron_uses_its_per_tensor_fallbacks_here():
    """No Apex / TransformerEngine on this machine: the fallbacks the speed-up replaces are the ones in use."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as megatron_optimizer

    assert clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm
    assert clip_grads.multi_tensor_scale_impl is utils.local_multi_tensor_scale
    assert megatron_optimizer.multi_tensor_scale_impl is utils.local_multi_tensor_scale
    assert MULTI_TENSOR_FOREACH.speed_up


def test_lightning_predict_loop_still_fails_fed_the_iterator_without_returned_predictions():
    loader = DataLoader(torch.randn(4, 2), batch_size=2)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    with pytest.raises(UnboundLocalError, match="any_on_epoch"):
        trainer.predict(IterPredictor(), loader, return_predictions=False)
    returned = trainer.predict(IterPredictor(), loader, return_predictions=True)
    assert returned is not None
    assert len(returned) == 2


def test_megatron_falls_back_to_torch_adam_here():
    """What fused_adam speeds up: without Apex or TransformerEngine megatron builds torch's (unfused) Adam."""
    from megatron.core import optimizer

    assert optimizer.USING_PYTORCH_OPTIMIZER
