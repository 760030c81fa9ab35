"""Training, validation and fine-tuning steps run padded batches unpadded where the kernel is: the same outputs.

Off CUDA the unpadded attention is SDPA with a block-diagonal mask (the same maths as the padding mask), so the
equivalence is checked here with the decision stood in for; the GPU side is tests/gpu/test_unpadded_gpu.py.
"""

import pytest
import torch

from bionemo.esm2.model import ESM2Config
from bionemo.esm2.model import steps as steps_module
from bionemo.esm2.model.steps import UNPADDED_SWITCH, attention_dtype, forward_step, runs_unpadded
from bionemo.lightning import ensure_model_parallel
from support.hf_esm import padded_batch, random_sequences


def tiny_config(**overrides) -> ESM2Config:
    ensure_model_parallel()
    settings = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "ffn_hidden_size": 64, "seq_length": 64}
    return ESM2Config(**{**settings, **overrides})


def padded_mlm_batch() -> dict:
    ids, mask = padded_batch(random_sequences(3, seed=4))
    assert not mask.all()  # rows of different lengths: a padded batch
    return {"tokens": ids, "attention_mask": mask, "padding": mask, "host_lengths": mask.sum(1)}


def logits_and_gradients(step, model: torch.nn.Module, batch: dict, key: str, real: torch.Tensor):
    """``step``'s output ``key`` at real positions and the gradients of its squared sum."""
    model.zero_grad()
    out = step(model, batch)[key]
    loss = (out.float() * real).square().sum()
    loss.backward()
    return (out.detach() * real, [p.grad.clone() for p in model.parameters() if p.grad is not None])


def assert_same(unpadded, padded) -> None:
    assert unpadded[0].shape == padded[0].shape  # back in the padded layout
    torch.testing.assert_close(unpadded[0], padded[0], rtol=1e-5, atol=1e-5)
    assert len(unpadded[1]) == len(padded[1]) > 0
    for ours, reference in zip(unpadded[1], padded[1], strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)


def test_training_step_unpadded_gives_the_padded_logits_and_gradients(monkeypatch):
    torch.manual_seed(0)
    model = tiny_config().configure_model().train()
    batch = padded_mlm_batch()
    real = batch["attention_mask"].t()[..., None]  # logits are [s, b, v]
    padded = logits_and_gradients(forward_step, model, batch, "token_logits", real)
    calls = []
    real_unpad = steps_module.unpad
    monkeypatch.setattr(steps_module, "runs_unpadded", lambda *_: True)
    monkeypatch.setattr(steps_module, "unpad", lambda *args: calls.append(1) or real_unpad(*args))
    assert_same(logits_and_gradients(forward_step, model, batch, "token_logits", real), padded)
    assert calls == [1]


@pytest.mark.parametrize("case", ["classification", "token-classification"])
def test_finetune_step_unpadded_gives_the_padded_logits_and_gradients(monkeypatch, case):
    from bionemo.esm2.data import data_step
    from bionemo.esm2.finetune import steps as finetune_steps
    from bionemo.esm2.finetune.data import LabelledDataset, collate_labelled
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from support.layout_matrix_finetune import finetune_config, labelled

    ensure_model_parallel()
    config = finetune_config(case)
    torch.manual_seed(0)
    model = config.configure_model().train()
    dataset = LabelledDataset(labelled(case, 6, 1), config.spec.labels, length=6, group_size=6)
    batch = data_step(iter([collate_labelled([dataset[i] for i in range(6)], ProteinTokenizer().pad_id)]))
    assert batch["padding"] is not None
    real = batch["residue_mask"][..., None] if case == "token-classification" else torch.ones(1)
    step = finetune_steps.finetune_forward_step
    padded = logits_and_gradients(step, model, batch, "logits", real)
    monkeypatch.setattr(finetune_steps, "runs_unpadded", lambda *_: True)
    assert_same(logits_and_gradients(step, model, batch, "logits", real), padded)


def test_full_length_batches_stay_padded_and_cpu_batches_run_padded(monkeypatch):
    model = tiny_config().configure_model()
    batch = padded_mlm_batch()
    monkeypatch.setattr(steps_module, "unpad", lambda *_: pytest.fail("unpadded"))
    forward_step(model, {**batch, "padding": None})  # nothing padded: nothing to gain
    forward_step(model, batch)  # CPU: no variable-length kernel
    assert not runs_unpadded(model, batch["tokens"])


@pytest.fixture
def cuda_tokens_with_varlen(monkeypatch):
    """A stand-in for CUDA tokens and torch's varlen kernel (for half precision only, as torch's)."""
    monkeypatch.setattr("bionemo.lightning.varlen_attention_available", lambda dtype: dtype != torch.float32)

    class CudaTokens:
        is_cuda = True

    return CudaTokens()


def test_runs_unpadded_under_nemo_mixed_precision(cuda_tokens_with_varlen, monkeypatch):
    """NeMo's bf16-mixed sets ``params_dtype`` to float32 on the config; the model still runs attention in bf16."""
    from nemo.lightning import MegatronMixedPrecision
    from nemo.lightning.pytorch.plugins.mixed_precision import update_config_with_dtype_overrides

    config = tiny_config(params_dtype=torch.bfloat16)
    update_config_with_dtype_overrides(MegatronMixedPrecision(precision="bf16-mixed").dtype_config, config)
    assert config.params_dtype == torch.float32  # what NeMo's MegatronStrategy leaves
    assert config.bf16
    model = config.configure_model().train()
    assert attention_dtype(model) == torch.bfloat16
    assert runs_unpadded(model, cuda_tokens_with_varlen)

    monkeypatch.setenv(UNPADDED_SWITCH, "0")
    assert not runs_unpadded(model, cuda_tokens_with_varlen)
    monkeypatch.delenv(UNPADDED_SWITCH)
    for key, value in (("pipeline_model_parallel_size", 2), ("context_parallel_size", 2), ("sequence_parallel", True)):
        before = getattr(model.config, key)
        setattr(model.config, key, value)
        assert not runs_unpadded(model, cuda_tokens_with_varlen), key  # chunks of the padded sequence
        setattr(model.config, key, before)
        assert runs_unpadded(model, cuda_tokens_with_varlen)
    model.config.attention_dropout = 0.1
    assert not runs_unpadded(model, cuda_tokens_with_varlen)  # the kernel has no dropout
    assert runs_unpadded(model.eval(), cuda_tokens_with_varlen)  # validation: no dropout


def test_attention_dtype_of_plain_models_is_their_weights():
    model = tiny_config().configure_model()
    assert attention_dtype(model) == torch.float32
    assert attention_dtype(model.to(torch.bfloat16)) == torch.bfloat16
