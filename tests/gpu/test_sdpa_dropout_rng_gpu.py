"""SDPACoreAttention's dropout on a GPU draws from megatron's model-parallel RNG stream, not the default one."""

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_attention_dropout_uses_the_model_parallel_stream():
    import torch.nn.functional as F
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from bionemo.layers import SDPACoreAttention
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel(cuda=True)  # seeds the tracker's model-parallel-rng state (per tensor-parallel rank)
    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, attention_dropout=0.5)
    attention = SDPACoreAttention(config, 1, AttnMaskType.padding, "self").cuda().train()
    q = torch.randn(32, 2, 4, 16, device="cuda")
    torch.cuda.manual_seed(7)
    default_stream = F.scaled_dot_product_attention(*(q.permute(1, 2, 0, 3),) * 3, dropout_p=0.5)
    torch.cuda.manual_seed(7)
    ours = attention(q, q, q, None).view(32, 2, 4, 16).permute(1, 2, 0, 3)
    assert not torch.allclose(ours, default_stream)  # the default stream would give the very same mask
