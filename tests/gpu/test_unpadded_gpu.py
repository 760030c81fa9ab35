"""Unpadded prediction on a GPU: variable-length flash attention in bf16 gives the padded path's outputs."""

import pytest
import torch

from support.hf_esm import random_hf_esm, random_sequences

pytestmark = pytest.mark.gpu


def test_unpadded_bf16_on_varlen_flash_attention_equals_padded(tmp_path):
    from bionemo.esm2.checkpoints.load import load_checkpoint
    from bionemo.esm2.checkpoints.weights import apply_weights
    from bionemo.esm2.data import collate_proteins
    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.model.steps import make_predict_step
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.layers import varlen_attention_available
    from bionemo.lightning import ensure_model_parallel

    assert varlen_attention_available(torch.bfloat16), "torch's varlen attention is missing on this GPU image"
    ensure_model_parallel()
    random_hf_esm(tmp_path, hidden=128, heads=4, layers=3)  # head dim 32, as ESM-2 150M
    checkpoint = load_checkpoint(tmp_path)
    model = ESM2Config(**checkpoint.model).configure_model()
    apply_weights(model, checkpoint.tensors)
    model = model.cuda().to(torch.bfloat16).eval()
    tokenizer = ProteinTokenizer()
    items = [{"tokens": tokenizer.encode(s)} for s in random_sequences(16, seed=3, low=20, high=300)]
    batch = collate_proteins(items, tokenizer.pad_id)
    batch = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    batch["padding"] = batch["attention_mask"]
    options = {"embeddings": True, "logits": True, "perplexity": False, "residues": True, "layers": [1]}
    with torch.inference_mode():
        padded = make_predict_step(**options, num_layers=3)(model, batch)  # type: ignore[arg-type]
        unpadded = make_predict_step(**options, num_layers=3, unpadded=True)(model, batch)  # type: ignore[arg-type]
    for key in padded:
        cosine = torch.nn.functional.cosine_similarity(padded[key].flatten(1), unpadded[key].flatten(1))
        assert cosine.min() > 0.999, key
        torch.testing.assert_close(unpadded[key], padded[key], rtol=0.05, atol=0.05, msg=key)


def test_bf16_mixed_training_step_runs_unpadded_and_matches_padded(monkeypatch):
    """As NeMo's MegatronStrategy sets a model up for bf16-mixed (``params_dtype`` float32 on the config, the model
    in megatron's ``Float16Module``), a padded training batch runs unpadded, with the padded path's logits and
    gradients (bf16 tolerance)."""
    from megatron.core.transformer.module import Float16Module
    from nemo.lightning import MegatronMixedPrecision
    from nemo.lightning.pytorch.plugins.mixed_precision import update_config_with_dtype_overrides

    from bionemo.esm2.data import collate_proteins, data_step
    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.model import steps as steps_module
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    torch.manual_seed(0)
    config = ESM2Config(num_layers=3, hidden_size=128, num_attention_heads=4, ffn_hidden_size=256, seq_length=512)
    update_config_with_dtype_overrides(MegatronMixedPrecision(precision="bf16-mixed").dtype_config, config)
    model = Float16Module(config, config.configure_model().cuda()).train()
    tokenizer = ProteinTokenizer()
    items = [{"tokens": tokenizer.encode(s)} for s in random_sequences(16, seed=3, low=20, high=300)]
    batch = collate_proteins(items, tokenizer.pad_id)
    real = batch["attention_mask"].t().cuda()  # [s, b]
    labels = torch.where(real, batch["tokens"].t().cuda(), -100)

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        moved = data_step(iter([dict(batch)]))
        logits = steps_module.forward_step(model, moved)["token_logits"]  # [s, b, v]
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
        loss.backward()
        grads = [p.grad.float().clone() for p in model.parameters() if p.grad is not None]
        return logits.detach().float() * real[..., None], grads

    calls = []
    unpad = steps_module.unpad
    monkeypatch.setattr(steps_module, "unpad", lambda *args: calls.append(1) or unpad(*args))
    unpadded = run()
    assert calls == [1], "a padded bf16-mixed training batch did not run unpadded"
    monkeypatch.setenv(steps_module.UNPADDED_SWITCH, "0")
    padded = run()
    assert calls == [1]
    torch.testing.assert_close(unpadded[0], padded[0], rtol=0.05, atol=0.05)
    for ours, reference in zip(unpadded[1], padded[1], strict=True):
        cosine = torch.nn.functional.cosine_similarity(ours.flatten(), reference.flatten(), dim=0)
        assert cosine > 0.99


@pytest.mark.parametrize("head_dim", [32, 64])
def test_varlen_flash_attention_without_gradients_is_torchs_varlen_attn(head_dim):
    """Prediction calls the flash kernel directly (no TorchDynamo import): the same outputs, bit for bit, as
    ``torch.nn.attention.varlen.varlen_attn``; with gradients it is ``varlen_attn`` and its backward."""
    from torch.nn.attention.varlen import varlen_attn

    from bionemo.layers.sdpa_attention import varlen_flash_attention

    lengths = [5, 300, 17, 1026, 64]
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(sum(lengths), 8, head_dim, device="cuda", dtype=torch.bfloat16, generator=generator)
        for _ in range(3)
    )
    with torch.inference_mode():
        direct = varlen_flash_attention(q, k, v, bounds, max(lengths), None)
        reference = varlen_attn(q, k, v, bounds, bounds, max(lengths), max(lengths))
    assert torch.equal(direct, reference)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = varlen_flash_attention(*leaves, bounds, max(lengths), None)
    out.float().square().sum().backward()
    assert torch.equal(out.detach(), reference)
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)
