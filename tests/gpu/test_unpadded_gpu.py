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
