"""MegatronCompatCallback's fixes, with stand-in trainers (the real runs are in tests/gpu)."""

import sys
from types import SimpleNamespace

import pytest

from bionemo.lightning import MegatronCompatCallback
from bionemo.lightning._nemo import MegatronStrategy
from bionemo.lightning.megatron_compat import install_modelopt_stand_ins


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


def test_predict_without_returned_predictions_keeps_one_batch_and_returns_none(megatron_trainer):
    callback = MegatronCompatCallback()
    loop = megatron_trainer.predict_loop
    callback.on_predict_start(megatron_trainer, None)
    assert megatron_trainer.strategy.data_sampler.output_log is False
    assert loop.return_predictions is True  # Lightning 2.4 needs it with the dataloader-iter fetcher
    for batch in range(3):
        callback.on_predict_batch_start(megatron_trainer, None, None, batch)
        assert loop._predictions == [[]]
        loop._predictions[0].append(f"prediction {batch}")  # what the loop keeps after the step
    callback.on_predict_epoch_end(megatron_trainer, None)
    assert loop._predictions == [[]]
    assert loop.return_predictions is False


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
        installed = install_modelopt_stand_ins()
        assert installed is not importable
        from nemo.collections.llm.modelopt.model_utils import restore_modelopt_state, save_modelopt_state

        if installed:
            assert save_modelopt_state(None, "path") is None
            assert restore_modelopt_state(None, "path") is None
        assert install_modelopt_stand_ins() is False
    finally:
        for name in set(sys.modules) - before:
            if name.startswith("nemo.collections.llm"):
                del sys.modules[name]
