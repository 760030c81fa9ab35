"""The module's two step runners, NeMo's record of its constructor call, and NeMo-only data parts made lazily."""

import contextlib
import json
from types import SimpleNamespace

import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from megatron.core.optimizer import OptimizerConfig
from torch.utils.data import DataLoader

from bionemo.lightning import (
    BionemoLightningModule,
    LightningStepRunner,
    MegatronDataModule,
    StepRunner,
    ensure_model_parallel,
    is_megatron_strategy,
)
from bionemo.lightning._nemo import (
    MegatronDataSampler,
    MegatronOptimizerModule,
    MegatronStrategy,
    WrappedDataLoader,
    io,
)
from bionemo.lightning._nemo.step_runner import MEGATRON_STEP_RUNNER, MegatronStepRunner
from bionemo.lightning.step_runner import fire_megatron_event, step_runner_for
from support.tiny_gpt import BigramDataset, TinyGPTConfig, data_step, forward_step, make_module


class _OwnMegatronStrategy(MegatronStrategy):
    pass


def test_megatron_strategy_is_told_by_its_class():
    assert is_megatron_strategy(MegatronStrategy())
    assert is_megatron_strategy(_OwnMegatronStrategy())
    assert not is_megatron_strategy(DDPStrategy())
    assert not is_megatron_strategy(SingleDeviceStrategy(torch.device("cpu")))
    assert not is_megatron_strategy(object())
    lookalike = type("MegatronStrategy", (), {})  # NeMo's name, defined elsewhere
    assert not is_megatron_strategy(lookalike())


def test_the_runner_follows_the_trainer_strategy():
    assert isinstance(step_runner_for(None), LightningStepRunner)
    assert isinstance(step_runner_for(SimpleNamespace(strategy=DDPStrategy())), LightningStepRunner)  # type: ignore[arg-type]
    megatron = step_runner_for(SimpleNamespace(strategy=MegatronStrategy()))  # type: ignore[arg-type]
    assert isinstance(megatron, MegatronStepRunner)
    assert isinstance(megatron, StepRunner)
    assert isinstance(step_runner_for(None), StepRunner)


def test_under_megatron_every_step_returns_the_model_output(monkeypatch):
    ensure_model_parallel()
    torch.manual_seed(0)
    module = make_module()
    monkeypatch.setattr(module, "_step_runner", lambda: MEGATRON_STEP_RUNNER)
    module.configure_model()
    tokens = torch.randint(0, 32, (2, 16))
    batch = module.data_step(iter([{"tokens": tokens, "sample_index": torch.tensor([3, 4])}]))
    expected = module.forward_step(batch)["token_logits"]
    for step in (module.training_step, module.validation_step, module.test_step, module.predict_step):
        torch.testing.assert_close(step(batch)["token_logits"], expected)
    assert module.predict_step(batch)["sample_index"].tolist() == [3, 4]
    assert module.predict_step({"tokens": tokens[:0]}) is None
    params = [p for p in module.parameters() if p.grad is None]
    before = [p.detach().clone() for p in params]
    module.configure_gradient_clipping(torch.optim.SGD(params, lr=1.0), gradient_clip_val=1e-9)
    assert all(torch.equal(p, b) for p, b in zip(params, before, strict=True))  # megatron's optimizer clips


def test_lightning_runner_fires_megatron_hooks_with_the_arguments_each_names():
    seen: list[tuple[str, dict]] = []

    class Named:
        def on_megatron_reduce_microbatches_end(self, step, reduced):
            seen.append(("named", {"step": step, "reduced": reduced}))

    class Everything:
        def on_megatron_reduce_microbatches_end(self, **kwargs):
            seen.append(("all", kwargs))

    class NotAHook:
        on_megatron_reduce_microbatches_end = None

    fire_megatron_event(
        [Named(), Everything(), NotAHook(), object()], "on_megatron_reduce_microbatches_end", step=1, reduced=2, extra=3
    )
    assert seen == [("named", {"step": 1, "reduced": 2}), ("all", {"step": 1, "reduced": 2, "extra": 3})]


def _module(**kwargs) -> BionemoLightningModule:
    return BionemoLightningModule(
        TinyGPTConfig(num_layers=1),
        forward_step=forward_step,
        data_step=data_step,
        optimizer=MegatronOptimizerModule(config=OptimizerConfig(lr=0.02, optimizer="adam")),
        **kwargs,
    )


def test_nemo_record_is_made_at_construction_when_nemo_is_loaded():
    """As NeMo's IOMixin: a snapshot of the arguments, so later changes to the config do not show."""
    module = _module(extra_flag=7)
    record = module.__dict__["_bionemo_nemo_io"]
    module.config.num_layers = 5
    assert module.__io__ is record
    assert record.config.num_layers == 1
    assert record.extra_flag == 7
    assert io.reinit(module).config.num_layers == 1


class ScaledModule(BionemoLightningModule):
    """A subclass with its own constructor and var-keyword name."""

    def __init__(self, config: TinyGPTConfig, scale: int = 2, **extra) -> None:
        optimizer = MegatronOptimizerModule(config=OptimizerConfig(lr=0.5, optimizer="adam"))
        super().__init__(config, forward_step=forward_step, data_step=data_step, optimizer=optimizer, **extra)
        self.scale = scale


def test_a_subclass_records_its_own_constructor_call():
    module = ScaledModule(TinyGPTConfig(num_layers=1), scale=3, extra_flag=1)
    twice = io.reinit(io.reinit(module))
    assert type(twice) is ScaledModule
    assert (twice.scale, twice.module_construct_args, twice.optim.config.lr) == (3, {"extra_flag": 1}, 0.5)


def test_nemo_checkpoint_context_dumps_and_loads_the_module(tmp_path):
    """What NeMo's ModelCheckpoint saves next to a checkpoint (``TrainerContext.io_dump``), and loads back."""
    from nemo import lightning as nl
    from nemo.lightning.io.pl import TrainerContext

    module = _module(extra_flag=7, other={"a": 1})
    trainer = nl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    context = TrainerContext(model=module, trainer=trainer, extra={})
    with contextlib.suppress(ImportError):  # the YAML copy needs nemo_run; io.json is written before it
        context.io_dump(tmp_path, yaml_attrs=["model"])
    assert json.loads((tmp_path / "io.json").read_text())["root"]
    loaded = io.load_context(tmp_path, subpath="model")
    assert type(loaded) is BionemoLightningModule
    assert loaded.module_construct_args == {"extra_flag": 7, "other": {"a": 1}}
    assert (loaded.config.num_layers, loaded.optim.config.lr) == (1, 0.02)


def _datamodule() -> MegatronDataModule:
    return MegatronDataModule(
        train=BigramDataset(8, 16, 32, seed=1),
        predict=BigramDataset(5, 16, 32, seed=2, labels=False),
        micro_batch_size=2,
        global_batch_size=4,
        seq_length=16,
        shuffle_train=True,
    )


def test_the_data_sampler_is_built_when_first_asked_for():
    datamodule = _datamodule()
    assert datamodule._data_sampler is None
    sampler = datamodule.data_sampler
    assert isinstance(sampler, MegatronDataSampler)
    assert (sampler.seq_len, sampler.micro_batch_size, sampler.global_batch_size) == (16, 2, 4)
    assert sampler.dataloader_type == "cyclic"
    assert datamodule.data_sampler is sampler
    other = MegatronDataSampler(seq_len=16, micro_batch_size=2, global_batch_size=2)
    datamodule.data_sampler = other  # NeMo's setup_data_sampler gives it the strategy's own
    assert datamodule.data_sampler is other


def test_the_data_sampler_logs_no_per_step_metrics_unless_asked():
    # NeMo's sampler logs consumed_samples and global_batch_size after every step by default (host-to-device
    # copies and Lightning metric updates on the step's critical path); here only on request
    assert _datamodule().data_sampler.output_log is False
    datamodule = _datamodule()
    datamodule.log_sampler_metrics = True
    assert datamodule.data_sampler.output_log is True


def test_loaders_are_nemo_ones_only_under_megatron():
    datamodule = _datamodule()
    plain = datamodule.predict_dataloader()
    assert type(plain) is DataLoader
    assert datamodule._data_sampler is None
    datamodule.trainer = SimpleNamespace(strategy=MegatronStrategy())  # type: ignore[assignment]
    wrapped = datamodule.predict_dataloader()
    assert isinstance(wrapped, WrappedDataLoader)
    assert wrapped.mode == "predict"
    for loader in (plain, wrapped):
        assert (loader.batch_size, loader.drop_last) == (2, False)
    assert [b["sample_index"].tolist() for b in plain] == [b["sample_index"].tolist() for b in wrapped]
