"""TritonLayerNorm: torch's LayerNorm with Triton kernels on CUDA, forward and backward (switch-gated).

The kernels run here under Triton's CPU interpreter; their GPU run is tests/gpu/test_layer_norm_gpu.py.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from bionemo.layers.layer_norm import SWITCH, TritonLayerNorm, local_layer_norm
from bionemo.lightning import ensure_model_parallel

# In a process started with TRITON_INTERPRET=1 (Triton's own jit helpers, e.g. tl.sum's, are interpreted only when
# it is set before triton is imported): the kernel on CPU tensors against torch's LayerNorm in fp32
# (error relative to 1 + |reference|).
CHILD = """
import json, sys
import torch
import torch.nn.functional as F
import bionemo.layers._layer_norm_triton as kernels
from bionemo.layers._layer_norm_triton import layer_norm_rows
errors = {}
tiling = json.loads(sys.argv[1])
kernels.FORWARD_TILING = None if tiling is None else tuple(tiling)
for width, name in ((64, "float32"), (12, "float32"), (64, "bfloat16")):
    dtype = getattr(torch, name)
    torch.manual_seed(0)
    x = (torch.randn(5, 3, width) * 3 + 1.5).to(dtype)
    weight, bias = torch.randn(width).to(dtype), torch.randn(width).to(dtype)
    out = layer_norm_rows(x, weight, bias, 1e-5)
    assert out.dtype == dtype and out.shape == x.shape
    reference = F.layer_norm(x.float(), (width,), weight.float(), bias.float(), 1e-5)
    errors[f"{width}-{name}"] = float(((out.float() - reference).abs() / (1 + reference.abs())).max())
    offset = torch.randn(width) * 2  # fp32, added to every row before normalizing
    out = layer_norm_rows(x, weight, bias, 1e-5, offset)
    reference = F.layer_norm(x.float() + offset, (width,), weight.float(), bias.float(), 1e-5)
    errors[f"{width}-{name}-offset"] = float(((out.float() - reference).abs() / (1 + reference.abs())).max())
print(json.dumps(errors))
"""

# The training kernels against torch's autograd (37 rows: the backward's 4 programs take 10, 10, 10 and 7 rows).
TRAINING_CHILD = """
import json, sys
import torch
import torch.nn.functional as F
import bionemo.layers._layer_norm_triton as kernels
from bionemo.layers._layer_norm_triton import TrainingLayerNorm
errors = {}
tiling = json.loads(sys.argv[1])
kernels.FORWARD_TILING = None if tiling is None else tuple(tiling)
for rows, width, name in ((37, 64, "float32"), (10, 12, "float32"), (9, 64, "bfloat16")):
    dtype = getattr(torch, name)
    torch.manual_seed(0)
    x = (torch.randn(rows, width) * 3 + 1.5).to(dtype).requires_grad_()
    weight, bias = (torch.randn(width).to(dtype).requires_grad_() for _ in range(2))
    dy = torch.randn(rows, width).to(dtype)
    out = TrainingLayerNorm.apply(x, weight, bias, 1e-5)
    out.backward(dy)
    assert out.dtype == weight.grad.dtype == x.grad.dtype == dtype
    ours = [out.detach(), x.grad, weight.grad, bias.grad]
    leaves = [t.detach().float().requires_grad_() for t in (x, weight, bias)]
    reference = F.layer_norm(leaves[0], (width,), leaves[1], leaves[2], 1e-5)
    reference.backward(dy.float())
    for what, mine, theirs in zip(("out", "dx", "dw", "db"), ours, [reference.detach()] + [t.grad for t in leaves]):
        errors[f"{what}-{width}-{name}"] = float((mine.float() - theirs).abs().max() / (1 + theirs.abs().max()))
print(json.dumps(errors))
"""


@pytest.mark.parametrize("tiling", [None, [1, 2]], ids=["by-width", "1-row-per-program"])
def test_triton_kernel_equals_torch_layer_norm(tiling):
    """``width = 12``: not a power of two (masked lanes must not enter the mean or the variance); 15 rows: with the
    default 4 rows per program at these widths the last program has one row beyond the tensor (masked); one row per
    program is the setting for rows wider than 2048 lanes."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-c", CHILD, json.dumps(tiling)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    for offset in ("", "-offset"):
        assert errors[f"64-float32{offset}"] < 1e-5
        assert errors[f"12-float32{offset}"] < 1e-5
        assert errors[f"64-bfloat16{offset}"] < 8e-3  # the output rounded to bf16 (relative precision 2**-8)


@pytest.mark.parametrize("tiling", [None, [1, 2]], ids=["by-width", "1-row-per-program"])
def test_triton_training_kernels_equal_torch_autograd(tiling):
    """The forward's per-row statistics feed the backward, with 4 rows per program (the default at these widths; 37
    and 9 rows: a partial last program) and with one."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-c", TRAINING_CHILD, json.dumps(tiling)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    for key, error in errors.items():
        assert error < (1e-6 if "float32" in key else 1.6e-2), (key, error)


def test_forward_tiling_holds_at_most_4096_lanes_per_program():
    pytest.importorskip("triton")
    from bionemo.layers._layer_norm_triton import forward_tiling

    assert forward_tiling(1024) == (4, 4)  # width 640 (ESM-2 150M)
    assert forward_tiling(2048) == (2, 4)  # width 1280 (650M)
    for block in (16, 64, 256, 1024, 2048, 4096, 8192):
        rows, warps = forward_tiling(block)
        assert rows == 1 or rows * block <= 4096
        assert warps in (1, 2, 4, 8)


def _config():
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True)


def test_switched_off_megatron_builds_torch_layer_norm_as_before(monkeypatch):
    monkeypatch.setenv(SWITCH, "0")
    norm = local_layer_norm(_config(), 16, 1e-5)
    assert type(norm) is torch.nn.LayerNorm


def test_by_default_the_same_parameters_and_torch_outputs_off_cuda(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)
    torch.manual_seed(0)
    norm = local_layer_norm(_config(), 16, 1e-5)
    assert isinstance(norm, TritonLayerNorm)
    plain = torch.nn.LayerNorm(16, eps=1e-5)
    assert norm.state_dict().keys() == plain.state_dict().keys()
    x = torch.randn(4, 2, 16)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    torch.testing.assert_close(norm(x), F.layer_norm(x, (16,), norm.weight, norm.bias, 1e-5), rtol=0, atol=0)


def test_the_layer_spec_uses_it_unless_switched_off(monkeypatch):
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_block import TransformerBlock

    from bionemo.layers import sdpa_layer_spec

    ensure_model_parallel()
    for switch, expected in (("0", torch.nn.LayerNorm), (None, TritonLayerNorm)):
        if switch is None:
            monkeypatch.delenv(SWITCH, raising=False)
        else:
            monkeypatch.setenv(SWITCH, switch)
        block = TransformerBlock(_config(), spec=sdpa_layer_spec(AttnMaskType.padding))
        layer = block.layers[0]
        assert type(layer.input_layernorm) is expected
        assert type(layer.pre_mlp_layernorm) is expected
