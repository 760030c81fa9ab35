"""ResidualInGemmBlock: megatron's block whose prediction runs each residual add inside a GEMM, biases carried.

The path itself runs here on CPU in fp32 (torch's LayerNorm with the offset, SDPA) against megatron's block; the
CUDA-only decision is stood in for; tests/gpu/test_residual_gemm_gpu.py runs it on a GPU in bf16.
"""

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import bionemo.layers.residual_gemm as residual_gemm
from bionemo.layers import LoRAConfig, ResidualInGemmBlock, UnpaddedSequences, apply_lora, sdpa_layer_spec
from bionemo.lightning import ensure_model_parallel

LENGTHS = [5, 9, 3]


def _block(dtype: torch.dtype = torch.float32, post_process: bool = True, **settings: Any) -> Any:
    """Three layers of the local spec, weights and biases ~N(0, 0.3) (LayerNorm weights around 1)."""
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    ensure_model_parallel()
    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=3, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
        activation_func=F.gelu, params_dtype=dtype, attention_dropout=0.0, hidden_dropout=0.0, **settings,
    )  # fmt: skip
    block = ResidualInGemmBlock(config, spec=sdpa_layer_spec(AttnMaskType.padding), post_process=post_process)
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.normal_(1.0 if "layernorm.weight" in name else 0.0, 0.3)
    return block.to(dtype).eval()


def _angles(length: int, dim: int = 8) -> torch.Tensor:
    inverse = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.outer(torch.arange(length).float(), inverse)
    return torch.cat((freqs, freqs), dim=-1)  # [length, dim]


def _inputs(unpadded: bool, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    torch.manual_seed(1)
    longest = max(LENGTHS)
    if unpadded:
        positions = torch.cat([torch.arange(n) for n in LENGTHS])
        packed = UnpaddedSequences(
            boundaries=torch.tensor([0, 5, 14, 17], dtype=torch.int32),
            longest=longest,
            sequence_ids=torch.repeat_interleave(torch.arange(3), torch.tensor(LENGTHS)),
            positions=positions,
        )
        return {
            "hidden_states": torch.randn(sum(LENGTHS), 1, 32).to(dtype),
            "attention_mask": None,
            "rotary_pos_emb": _angles(longest)[positions][:, None, :],
            "packed_seq_params": packed,
        }
    padding = torch.arange(longest)[None, :] >= torch.tensor(LENGTHS)[:, None]
    return {
        "hidden_states": torch.randn(longest, 3, 32).to(dtype),
        "attention_mask": padding[:, None, None, :],
        "rotary_pos_emb": _angles(longest)[:, None, None, :],
    }


@pytest.mark.parametrize("post_process", [True, False], ids=["final-layernorm", "no-final-layernorm"])
@pytest.mark.parametrize("unpadded", [True, False], ids=["unpadded", "padded"])
def test_the_residual_gemms_give_megatrons_block_output(unpadded, post_process):
    """Forced on in fp32 on CPU: every real token's output equals megatron's layers' (padding rows aside)."""
    block = _block(post_process=post_process)
    inputs = _inputs(unpadded)
    with torch.no_grad():
        reference = super(ResidualInGemmBlock, block).forward(**inputs)
        ours = residual_gemm.forward_residual_in_gemm(
            block,
            inputs["hidden_states"],
            inputs["attention_mask"],
            inputs["rotary_pos_emb"],
            inputs.get("packed_seq_params"),
        )
    assert ours.shape == reference.shape
    if not unpadded:
        real = torch.arange(max(LENGTHS))[:, None] < torch.tensor(LENGTHS)[None, :]
        ours, reference = ours[real], reference[real]
    assert reference.abs().max() > 1  # the biases and residuals are not negligible
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


def test_the_block_takes_the_path_where_it_applies(monkeypatch):
    """``forward`` hands over to the residual GEMMs when the decision says so, and returns their output."""
    block = _block()
    inputs = _inputs(unpadded=True)
    calls = []
    path = residual_gemm.forward_residual_in_gemm

    def counted(*args: Any) -> torch.Tensor:
        calls.append(args)
        return path(*args)

    monkeypatch.setattr(residual_gemm, "residual_in_gemm_applies", lambda *args: True)
    monkeypatch.setattr(residual_gemm, "forward_residual_in_gemm", counted)
    with torch.no_grad():
        ours = block(**inputs)
        monkeypatch.setattr(residual_gemm, "residual_in_gemm_applies", lambda *args: False)
        reference = block(**inputs)
    assert len(calls) == 1
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


@pytest.fixture
def cuda_stand_in(monkeypatch):
    """CPU tensors answer ``is_cuda``: the decision's other conditions are what is tested."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))


def _applies(block: Any, unpadded: bool = True) -> bool:
    inputs = _inputs(unpadded, torch.bfloat16)
    return residual_gemm.residual_in_gemm_applies(
        block, inputs["hidden_states"], inputs["rotary_pos_emb"], inputs.get("packed_seq_params")
    )


@pytest.mark.usefixtures("cuda_stand_in")
def test_it_applies_to_half_precision_prediction_only(monkeypatch):
    block = _block(torch.bfloat16)
    assert not _applies(block)  # gradients are recorded: training keeps megatron's layers
    with torch.no_grad():
        assert _applies(block)
        assert _applies(block, unpadded=False)
        inputs = _inputs(True)  # fp32 hidden states
        assert not residual_gemm.residual_in_gemm_applies(block, inputs["hidden_states"], inputs["rotary_pos_emb"])
        block.train()
        assert not _applies(block)
        block.eval()
        monkeypatch.setenv(residual_gemm.SWITCH, "0")
        assert not _applies(block)


@pytest.mark.usefixtures("cuda_stand_in")
def test_a_hook_on_any_module_keeps_megatrons_layers():
    """A caller capturing a layer's output (ESM2Model's hidden layers) must see the layer run."""
    block = _block(torch.bfloat16)
    handle = block.layers[1].register_forward_hook(lambda *args: None)
    with torch.no_grad():
        assert not _applies(block)
        handle.remove()
        handle = block.layers[0].self_attention.linear_proj.register_forward_pre_hook(lambda *args: None)
        assert not _applies(block)
        handle.remove()
        assert _applies(block)


@pytest.mark.usefixtures("cuda_stand_in")
@pytest.mark.parametrize("target", ["self_attention.linear_proj", "mlp.linear_fc2"])
def test_a_lora_adapted_residual_linear_keeps_megatrons_layers(target):
    """The adapter adds its own product to the linear's output, which the residual GEMM would skip."""
    block = _block(torch.bfloat16)
    assert apply_lora(block, LoRAConfig(rank=2, targets=frozenset({target})))
    with torch.no_grad():
        assert not _applies(block)


@pytest.mark.usefixtures("cuda_stand_in")
def test_other_layer_settings_keep_megatrons_layers():
    block = _block(torch.bfloat16, apply_residual_connection_post_layernorm=True)
    with torch.no_grad():
        assert not _applies(block)
