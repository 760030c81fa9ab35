"""ResidualInGemmBlock on a GPU: bf16 ESM-2 prediction with the residual adds inside the GEMMs, against megatron's
layers (``BIONEMO_RESIDUAL_IN_GEMM=0``), both against the same model in fp32."""

from typing import Any

import pytest
import torch

import bionemo.layers.residual_gemm as residual_gemm
from support.hf_esm import random_sequences

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("unpadded", [True, False], ids=["unpadded", "padded"])
def test_the_residual_gemms_are_no_farther_from_fp32_than_megatrons_layers(monkeypatch, unpadded):
    """ESM-2 150M's width (640, 20 heads), 6 layers, biases ~N(0, 0.1) so that their carried sum matters."""
    from bionemo.esm2.data import collate_proteins
    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.model.steps import make_predict_step
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    torch.manual_seed(0)
    config = ESM2Config(num_layers=6, hidden_size=640, num_attention_heads=20, ffn_hidden_size=2560)
    model: Any = config.configure_model().cuda().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and "layernorm" not in name:
                p.normal_(0, 0.1)
    half: Any = config.configure_model().cuda()
    half.load_state_dict(model.state_dict())
    half = half.to(torch.bfloat16).eval()
    tokenizer = ProteinTokenizer()
    items = [{"tokens": tokenizer.encode(s)} for s in random_sequences(24, seed=5, low=20, high=400)]
    batch = collate_proteins(items, tokenizer.pad_id)
    batch = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    batch["padding"] = batch["attention_mask"]
    step: Any = make_predict_step(embeddings=True, logits=True, perplexity=False, residues=True, unpadded=unpadded)
    calls = []
    path = residual_gemm.forward_residual_in_gemm
    monkeypatch.setattr(residual_gemm, "forward_residual_in_gemm", lambda *args: calls.append(1) or path(*args))
    with torch.inference_mode():
        reference = step(model, batch)
        assert not calls  # fp32 runs megatron's layers
        fused = step(half, batch)
        assert calls == [1]
        monkeypatch.setenv(residual_gemm.SWITCH, "0")
        unfused = step(half, batch)
        assert calls == [1]
    for key in ("embeddings", "residue_embeddings", "logits"):
        fused_error = (fused[key].float() - reference[key].float()).abs()
        unfused_error = (unfused[key].float() - reference[key].float()).abs()
        assert fused_error.mean() <= unfused_error.mean() * 1.1, key
        assert fused_error.max() <= unfused_error.max() * 1.5, key
