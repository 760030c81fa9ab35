"""The unpadded prediction attention kernel (RoPE applied as it loads) against eager attention per sequence.

The Triton kernel runs under Triton's CPU interpreter in a child process (tests/support/varlen_attention_cases.py);
its GPU runs are tests/gpu/test_unpadded_gpu.py and the prediction benchmarks
(docs/benchmarks.md#prediction-throughput-against-transformers).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.varlen_attention_cases import KERNEL_CASES, case_name


@pytest.fixture(scope="module")
def interpreted() -> dict:
    pytest.importorskip("triton")
    tests = Path(__file__).parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(tests), *sys.path])}
    command = [sys.executable, "-m", "support.varlen_attention_cases"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False, cwd=tests)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", KERNEL_CASES, ids=[case_name(*case) for case in KERNEL_CASES])
def test_kernel_equals_eager_attention_per_sequence(interpreted, case):
    """fp32 to 1e-5; fp16 within its rounding (relative precision 2**-11; the rotated inputs are rounded too)."""
    error = interpreted["kernel"][case_name(*case)]
    assert error < (1e-5 if case[1] == "float32" else 5e-3)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_rotary_self_attention_leaves_rope_to_the_kernel_when_predicting_unpadded(interpreted, dtype):
    """With the kernel available (stood in for on CPU), RoPE moves into the core attention: the same outputs.

    fp16 runs the (interpreted) kernel, with RoPE, once; fp32 is not the kernel's, so the core attention applies
    the deferred rotation itself: both equal the module with the kernel unavailable (RoPE in the projection).
    """
    seen = interpreted["module"][dtype]
    assert seen["calls"] == ([True] if dtype == "float16" else [])
    assert seen["difference"] < (1e-5 if dtype == "float32" else 5e-3)
    assert seen["unchanged"]  # the caller's packed parameters are not edited


def test_the_kernel_is_for_prediction_only(monkeypatch):
    """Recording gradients, or with the switch off, unpadded attention stays on the differentiable kernels."""
    import bionemo.layers.sdpa_attention as sdpa

    monkeypatch.setattr("bionemo.layers._triton.triton_importable", lambda: True)
    x = torch.zeros(1)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert not sdpa.triton_attention_available(x)  # gradients are recorded here
    with torch.no_grad():
        assert sdpa.triton_attention_available(x)
        monkeypatch.setenv(sdpa.TRITON_ATTENTION_SWITCH, "0")
        assert not sdpa.triton_attention_available(x)
