"""The work-around machinery: patch records, version gates, and MegatronCompatCallback's apply-and-remove."""

import sys
import types
import warnings
from typing import Any, ClassVar

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from bionemo.callbacks import merge_predictions
from bionemo.lightning import MegatronCompatCallback, MegatronDataModule, megatron_compat
from bionemo.lightning.workarounds import WORKAROUNDS, Patches, UnverifiedUpstreamWarning, Workaround, workaround
from bionemo.lightning.workarounds.multi_tensor_foreach import foreach_l2_norm, foreach_scale
from support.tiny_gpt import BigramDataset, make_module
from support.trainers import cpu_trainer


def _patched_places() -> dict[str, object]:
    """Every megatron-core / NeMo / Lightning attribute a work-around may replace, and the stand-in modules."""
    from lightning.pytorch.loops import prediction_loop
    from lightning.pytorch.loops.prediction_loop import _PredictionLoop
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as megatron_optimizer
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from nemo.lightning.pytorch.plugins.data_sampler import MegatronDataSampler

    from bionemo.lightning._nemo import MegatronStep, MegatronStrategy

    places: dict[str, object] = {
        "clip_grads.l2_norm_impl": clip_grads.l2_norm_impl,
        "clip_grads.multi_tensor_scale_impl": clip_grads.multi_tensor_scale_impl,
        "optimizer.multi_tensor_scale_impl": megatron_optimizer.multi_tensor_scale_impl,
        "utils.local_multi_tensor_l2_norm": utils.local_multi_tensor_l2_norm,
        "utils.local_multi_tensor_scale": utils.local_multi_tensor_scale,
        "prediction_loop.move_data_to_device": vars(prediction_loop)["move_data_to_device"],
        "nemo.collections.llm modules": sorted(n for n in sys.modules if n.startswith("nemo.collections.llm")),
    }
    for cls in (
        DistributedOptimizer,
        _PredictionLoop,
        MegatronStep,
        MegatronDataSampler,
        MegatronStrategy,
        pl.Trainer,
    ):
        places.update({f"{cls.__name__}.{name}": value for name, value in vars(cls).items()})
    return places


def _fit_and_predict(callbacks: list[pl.Callback]) -> pl.Trainer:
    torch.manual_seed(0)
    datamodule = MegatronDataModule(
        train=BigramDataset(32, 16, 32, seed=1),
        val=BigramDataset(8, 16, 32, seed=2),
        predict=BigramDataset(12, 16, 32, seed=3, labels=False),
        micro_batch_size=4,
        seq_length=16,
    )
    trainer = cpu_trainer(callbacks, max_steps=3, limit_val_batches=1)
    module = make_module()
    trainer.fit(module, datamodule=datamodule)
    assert trainer.predict(module, datamodule=datamodule, return_predictions=False) is None
    return trainer


class _Probe(pl.Callback):
    """Records, during each stage, which patches are in effect."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, bool]] = {}

    def _look(self, trainer: pl.Trainer, stage: str) -> None:
        from megatron.core.optimizer import clip_grads
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

        self.seen[stage] = {
            "multi_tensor_foreach": clip_grads.l2_norm_impl is foreach_l2_norm,
            "distributed_optimizer_step": getattr(
                DistributedOptimizer._set_main_param_and_optimizer_states, "_bionemo_keeps_step", False
            ),
            "return_predictions": trainer.predict_loop.return_predictions,
        }

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._look(trainer, "fit")

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._look(trainer, "predict")


def test_a_plain_lightning_fit_leaves_no_upstream_attribute_patched():
    before = _patched_places()
    probe = _Probe()
    trainer = _fit_and_predict([probe])
    assert _patched_places() == before
    compat = [cb for cb in trainer.callbacks if isinstance(cb, MegatronCompatCallback)]
    assert len(compat) == 1  # added by the module
    assert compat[0].applied == frozenset()
    assert not probe.seen["fit"]["multi_tensor_foreach"]


def test_under_megatron_the_work_arounds_apply_per_stage_and_are_removed_at_teardown(monkeypatch):
    """``_is_megatron`` mocked: the module runs under Lightning's strategy, the callback acts as under Megatron."""
    monkeypatch.setattr(megatron_compat, "_is_megatron", lambda trainer: True)
    before = _patched_places()
    probe, compat = _Probe(), MegatronCompatCallback()
    trainer = _fit_and_predict([probe, compat])
    assert _patched_places() == before
    assert compat.applied == frozenset()
    assert probe.seen["fit"] == {
        "multi_tensor_foreach": True,
        "distributed_optimizer_step": True,
        "return_predictions": False,
    }
    # prediction needs no optimizer patches; the loop takes its returning path (keeping nothing): any_on_epoch bug
    assert probe.seen["predict"] == {
        "multi_tensor_foreach": False,
        "distributed_optimizer_step": False,
        "return_predictions": True,
    }
    assert trainer.predict_loop.return_predictions is False
    assert trainer.limit_val_batches == 1


def test_skipped_work_arounds_are_not_applied(monkeypatch):
    monkeypatch.setattr(megatron_compat, "_is_megatron", lambda trainer: True)
    probe = _Probe()
    _fit_and_predict([probe, MegatronCompatCallback(skip=["multi_tensor_foreach"])])
    assert probe.seen["fit"]["multi_tensor_foreach"] is False
    assert probe.seen["fit"]["distributed_optimizer_step"] is True  # not skipped


def test_an_exception_during_fit_removes_them_too(monkeypatch):
    class Boom(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            raise RuntimeError("boom")

    monkeypatch.setattr(megatron_compat, "_is_megatron", lambda trainer: True)
    before = _patched_places()
    compat = MegatronCompatCallback()
    with pytest.raises(RuntimeError, match="boom"):
        _fit_and_predict([compat, Boom()])
    assert _patched_places() == before
    assert compat.applied == frozenset()


class _HostCopies(torch.Tensor):
    """A tensor that records every ``.to(...)`` called on it (results are plain tensors)."""

    calls: ClassVar[list[tuple[tuple[Any, ...], dict[str, Any]]]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            cls.calls.append((tuple(args[1:]), dict(kwargs)))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


class _IterWriterPredictor(pl.LightningModule):
    """``predict_step(dataloader_iter)`` over ``(x [n, 2], sample_index [n])`` batches: ``y = layer(x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 3)

    def predict_step(self, dataloader_iter):
        (x, index), _, _ = next(dataloader_iter)
        return {"sample_index": index, "y": self.layer(x).as_subclass(_HostCopies)}


def test_predict_from_the_iterator_hands_the_writer_every_batch_and_keeps_no_host_copy(monkeypatch, tmp_path):
    """No UnboundLocalError ('any_on_epoch'), predict returns None, and the loop copies no output to the host.

    Only the writer moves outputs to the host (a non-blocking copy of a detached tensor, not recorded here):
    Lightning's loop, told to return predictions, would copy each batch with a blocking ``.to("cpu")``.
    """
    from lightning.pytorch.loops import prediction_loop

    from bionemo.callbacks import PredictionWriter
    from bionemo.losses import ParallelGroups

    monkeypatch.setattr(megatron_compat, "_is_megatron", lambda trainer: True)
    monkeypatch.setattr(_HostCopies, "calls", [])
    original_move = vars(prediction_loop)["move_data_to_device"]
    kept: list[list[Any]] = []

    class Kept(pl.Callback):
        def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            kept.append([p for loader in trainer.predict_loop._predictions for p in loader if p is not None])

    torch.manual_seed(0)
    x = torch.randn(6, 2)
    loader = DataLoader(torch.utils.data.TensorDataset(x, torch.arange(6)), batch_size=2)
    module = _IterWriterPredictor()
    writer = PredictionWriter(tmp_path, "batch", groups=ParallelGroups())
    trainer = cpu_trainer([MegatronCompatCallback(), writer, Kept()])
    assert trainer.predict(module, loader, return_predictions=False) is None
    assert _HostCopies.calls == []  # no blocking host copy of any batch by the loop
    assert kept == [[], [], []]
    assert trainer.predict_loop.return_predictions is False
    assert vars(prediction_loop)["move_data_to_device"] is original_move
    merged = merge_predictions(tmp_path)
    assert merged["sample_index"].tolist() == list(range(6))
    with torch.no_grad():
        expected = x @ module.layer.weight.T + module.layer.bias
    torch.testing.assert_close(merged["y"], expected)


def test_predict_returning_predictions_under_megatron_still_returns_every_batch(monkeypatch):
    """With ``return_predictions=True`` the loop keeps (and copies) the outputs, as the caller asked."""
    monkeypatch.setattr(megatron_compat, "_is_megatron", lambda trainer: True)
    monkeypatch.setattr(_HostCopies, "calls", [])
    x = torch.randn(4, 2)
    loader = DataLoader(torch.utils.data.TensorDataset(x, torch.arange(4)), batch_size=2)
    module = _IterWriterPredictor()
    returned = cpu_trainer([MegatronCompatCallback()]).predict(module, loader, return_predictions=True)
    assert returned is not None
    assert [batch["sample_index"].tolist() for batch in returned] == [[0, 1], [2, 3]]  # pyright: ignore
    with torch.no_grad():
        torch.testing.assert_close(torch.cat([b["y"] for b in returned]), module.layer(x))  # pyright: ignore


# --- Patches and Workaround --------------------------------------------------------------------------------


class _Base:
    def method(self) -> str:
        return "base"


class _Child(_Base):
    own = 1

    @property
    def prop(self) -> int:
        return self.__dict__.get("_prop", 0)

    @prop.setter
    def prop(self, value: int) -> None:
        self.__dict__["_prop"] = value


def test_patches_restore_own_inherited_instance_property_and_mapping_entries():
    module = types.ModuleType("fake_upstream")
    module.impl = len  # type: ignore[attr-defined]
    obj = _Child()
    mapping: dict[str, object] = {"kept": 1}
    with Patches() as patches:
        patches.set(_Child, "own", 2)
        patches.set(_Child, "method", lambda self: "patched")  # inherited from _Base
        patches.set(obj, "method", lambda: "instance")  # the class's method, shadowed on the object
        patches.set(obj, "prop", 5)
        patches.set(module, "impl", max)
        patches.set_item(mapping, "kept", 2)
        patches.set_item(mapping, "new", 3)
        assert patches.has(obj, "prop")
        assert (_Child.own, _Child().method(), obj.method(), obj.prop, module.impl) == (
            2,
            "patched",
            "instance",
            5,
            max,
        )
    assert "method" not in vars(_Child)
    assert "method" not in vars(obj)
    assert (_Child.own, obj.method(), obj.prop, module.impl) == (1, "base", 0, len)
    assert mapping == {"kept": 1}
    assert not patches.has(obj, "prop")


def test_an_unverified_version_is_not_applied_and_said_once(monkeypatch):
    monkeypatch.setattr(workaround, "_warned", set())
    installed: list[int] = []
    fake = Workaround(
        name="fake",
        upstream="an upstream bug\nmore detail",
        verified={"lightning": "0.0.1"},
        sources={},
        install=lambda patches: installed.append(1),
    )
    with pytest.warns(
        UnverifiedUpstreamWarning, match=r"'fake' not applied: installed lightning 2\..* \(verified: 0\.0\.1\)"
    ):
        assert fake.apply(Patches()) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fake.apply(Patches()) is False  # said once
    assert installed == []
    verified = Workaround(
        name="fake2", upstream="x", verified={"lightning": workaround.installed_version("lightning") or ""}, sources={}
    )
    assert verified.apply(Patches()) is True


def test_the_callback_applies_nothing_on_unverified_versions(monkeypatch):
    monkeypatch.setattr(workaround, "_warned", set())
    monkeypatch.setattr(workaround, "installed_version", lambda name: "99.0.0")
    monkeypatch.setattr(megatron_compat, "_is_megatron", lambda trainer: True)
    before = _patched_places()
    probe = _Probe()
    with pytest.warns(UnverifiedUpstreamWarning) as record:
        _fit_and_predict([probe])
    said = [str(w.message) for w in record if issubclass(w.category, UnverifiedUpstreamWarning)]
    # each once; the step hook is NeMo's, which Lightning's strategy never calls
    expected = sorted(w.name for w in WORKAROUNDS if w.name != "step_without_distillation_shapes")
    assert sorted(s.split("'")[1] for s in said) == expected
    assert not probe.seen["fit"]["multi_tensor_foreach"]
    assert _patched_places() == before


def test_workaround_fields_are_validated():
    with pytest.raises(ValueError, match="verified"):
        Workaround(name="x", upstream="y", verified={}, sources={})
    with pytest.raises(ValueError, match="stages"):
        Workaround(name="x", upstream="y", verified={"a": "1"}, sources={}, stages=frozenset({"train"}))  # type: ignore[arg-type]


def test_skip_names_are_checked(monkeypatch):
    with pytest.raises(ValueError, match=r"unknown work-arounds \['fix 9'\]; valid names: \["):
        MegatronCompatCallback(skip=["fix 9"])
    with pytest.raises(TypeError, match="not the string"):
        MegatronCompatCallback(skip="multi_tensor_foreach")
    monkeypatch.setenv(megatron_compat.SKIP_ENV, "multi_tensor_foreach, fused_adam")
    assert MegatronCompatCallback().skip == {"multi_tensor_foreach", "fused_adam"}
    monkeypatch.setenv(megatron_compat.SKIP_ENV, "nope")
    with pytest.raises(ValueError, match=r"\$BIONEMO_SKIP_WORKAROUNDS names unknown"):
        MegatronCompatCallback()


def test_backward_compatible_names_stay_importable():
    """Scripts, benchmarks and ``data.py`` import these from ``megatron_compat``."""
    for name in (
        "install_distributed_optimizer_step_fix",
        "install_modelopt_stand_ins",
        "install_multi_tensor_fix",
        "scale_limits_to_steps",
    ):
        assert callable(getattr(megatron_compat, name)), name
    assert (megatron_compat.foreach_l2_norm, megatron_compat.foreach_scale) == (foreach_l2_norm, foreach_scale)
