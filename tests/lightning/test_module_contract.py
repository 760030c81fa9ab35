"""BionemoLightningModule's contract, checked without a Trainer."""

import pytest
import torch
from megatron.core.optimizer import OptimizerConfig

from bionemo.lightning import (
    BionemoLightningModule,
    LightningPassthroughPredictionMixin,
    default_megatron_optimizer,
    torch_optimizer_from_config,
)
from bionemo.lightning._nemo import MegatronOptimizerModule, io
from bionemo.lightning._nemo.step_runner import MEGATRON_STEP_RUNNER
from bionemo.losses import MaskedTokenLossReduction, PassthroughLossReduction
from support.tiny_gpt import TinyGPTConfig, data_step, forward_step, make_module


class NoneConfig(TinyGPTConfig):
    def configure_model(self, *args, **kwargs):
        return None


class RecordingConfig(TinyGPTConfig):
    """Records the keyword arguments configure_model receives."""

    def configure_model(self, *args, **kwargs):
        self.__dict__.setdefault("calls", []).append(kwargs)
        return super().configure_model()


def test_configure_model_is_idempotent_and_passes_construct_args():
    config = RecordingConfig()
    module = make_module(config, extra_flag=3)
    module.configure_model()
    first = module.module
    module.configure_model()
    assert module.module is first
    assert config.calls == [{"extra_flag": 3}]


def test_configure_model_none_raises():
    module = make_module(NoneConfig())
    with pytest.raises(ValueError, match=r"NoneConfig.configure_model\(\) returned None"):
        module.configure_model()


def test_model_transform_runs_after_the_model_is_built():
    seen = []

    def freeze_embeddings(model):
        seen.append(type(model).__name__)
        for p in model.embedding.parameters():
            p.requires_grad_(False)

    module = make_module(model_transform=freeze_embeddings)
    module.configure_model()
    assert seen == ["GPTModel"]
    assert not any(p.requires_grad for p in module.module.embedding.parameters())
    assert any(p.requires_grad for p in module.module.decoder.parameters())

    replacement = torch.nn.Linear(2, 2)
    module = make_module(model_transform=lambda model: replacement)
    module.configure_model()
    assert module.module is replacement


def test_forward_and_steps_pass_through_to_the_model():
    torch.manual_seed(0)
    module = make_module()
    module.configure_model()
    tokens = torch.randint(0, 32, (2, 16))
    position_ids = torch.arange(16).expand(2, 16)
    direct = module.module(tokens, position_ids, None)
    torch.testing.assert_close(module(tokens, position_ids, None), direct)
    batch = module.data_step(iter([{"tokens": tokens}]))
    out = module.forward_step(batch)
    torch.testing.assert_close(out["token_logits"], direct.transpose(0, 1))


def test_loss_reductions_and_prediction_contract():
    module = make_module()
    assert isinstance(module.training_loss_reduction(), MaskedTokenLossReduction)
    assert not module.training_loss_reduction().validation_step
    assert module.validation_loss_reduction().validation_step
    assert module.test_loss_reduction().validation_step
    assert isinstance(module.predict_loss_reduction(), PassthroughLossReduction)
    assert isinstance(module, LightningPassthroughPredictionMixin)
    assert module.optim.config.lr == 3e-3


def test_predict_step_without_trainer_keeps_index_and_skips_empty_batches():
    module = make_module()
    tokens = torch.randint(0, 32, (3, 16))
    out = module.predict_step({"tokens": tokens, "sample_index": torch.tensor([4, 5, 6])})
    assert out["token_logits"].shape == (16, 3, 32)
    assert out["sample_index"].tolist() == [4, 5, 6]
    assert module.predict_step({}) is None
    assert module.predict_step(None) is None
    assert module.predict_step({"tokens": torch.zeros(0, 16, dtype=torch.long)}) is None


def test_default_megatron_optimizer():
    optim = default_megatron_optimizer()
    assert isinstance(optim, MegatronOptimizerModule)
    assert optim.config.optimizer == "adam"
    assert optim.config.lr == 1e-4
    assert optim.config.use_distributed_optimizer


def test_torch_optimizer_honours_the_config():
    params = [torch.nn.Parameter(torch.zeros(2))]
    adam = torch_optimizer_from_config(
        OptimizerConfig(optimizer="adam", lr=0.01, weight_decay=0.1, adam_beta1=0.8, adam_beta2=0.9, adam_eps=1e-6),
        params,
    )
    assert isinstance(adam, torch.optim.AdamW)
    group = adam.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["betas"], group["eps"]) == (0.01, 0.1, (0.8, 0.9), 1e-6)
    sgd = torch_optimizer_from_config(OptimizerConfig(optimizer="sgd", lr=0.5, sgd_momentum=0.7), params)
    assert isinstance(sgd, torch.optim.SGD)
    assert sgd.param_groups[0]["momentum"] == 0.7
    config = OptimizerConfig(optimizer="adam")
    config.optimizer = "lamb"
    with pytest.raises(ValueError, match="'lamb' is not supported; use 'adam' or 'sgd'"):
        torch_optimizer_from_config(config, params)


def test_io_reinit_keeps_model_construct_args_flat():
    module = BionemoLightningModule(
        TinyGPTConfig(num_layers=1),
        forward_step=forward_step,
        data_step=data_step,
        optimizer=MegatronOptimizerModule(config=OptimizerConfig(lr=0.02, optimizer="adam")),
        extra_flag=7,
        other={"a": 1},
    )
    rebuilt = io.reinit(module)
    assert isinstance(rebuilt, BionemoLightningModule)
    assert rebuilt.module_construct_args == {"extra_flag": 7, "other": {"a": 1}}
    assert rebuilt.config.num_layers == 1
    assert rebuilt.optim.config.lr == 0.02
    twice = io.reinit(rebuilt)
    assert twice.module_construct_args == {"extra_flag": 7, "other": {"a": 1}}


def test_compat_import_path():
    from bionemo.llm import lightning as compat

    for name in (
        "BionemoLightningModule",
        "batch_collator",
        "PassthroughLossReduction",
        "LightningPassthroughPredictionMixin",
        "PerplexityLoggingCallback",
        "default_megatron_optimizer",
        "some_first",
        "get_dtype_device",
        "DataStep",
        "ForwardStep",
    ):
        assert hasattr(compat, name), name
    assert compat.BionemoLightningModule is BionemoLightningModule


@pytest.mark.parametrize(
    ("reduction", "per_token"), [(MaskedTokenLossReduction, True), (PassthroughLossReduction, False)]
)
def test_megatron_trains_the_global_token_weighted_mean_of_token_weighted_reductions(monkeypatch, reduction, per_token):
    """Under MegatronStrategy megatron averages per-micro-batch means unless calculate_per_token_loss is set."""
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    config = TinyGPTConfig()
    monkeypatch.setattr(config, "get_loss_reduction_class", lambda: reduction)
    module = make_module(config)
    monkeypatch.setattr(module, "_step_runner", lambda: MEGATRON_STEP_RUNNER)
    module.configure_model()
    assert config.calculate_per_token_loss is per_token
