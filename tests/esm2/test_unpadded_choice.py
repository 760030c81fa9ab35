"""Which batches ``run predict`` uses: unpadded wherever it can run, ``--unpadded`` checked, ``--padded`` obeyed.

The GPU side (variable-length attention on an H200) is tests/gpu/test_unpadded_gpu.py; here the decision only,
with the accelerator and torch's varlen attention stood in for.
"""

import pytest

import bionemo.esm2.recipes.predict as predict
import bionemo.recipes.trainers as trainers
from bionemo.recipes.settings import Precision, RunSettings, SettingsError


@pytest.fixture
def gpu_with_varlen(monkeypatch):
    monkeypatch.setattr(trainers, "accelerator", lambda settings: "gpu")
    monkeypatch.setattr(predict, "_varlen_attention_available", lambda precision: True)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"precision": Precision.BF16}, True),
        ({"precision": Precision.FP16, "devices": 2}, True),  # data parallelism: whole sequences per rank
        ({"precision": Precision.FP32}, False),  # flash attention needs half precision
        ({"precision": Precision.BF16, "tensor_parallel": 2}, False),
        ({"precision": Precision.BF16, "pipeline_parallel": 2}, False),
        ({"precision": Precision.BF16, "context_parallel": 2}, False),
        ({"precision": Precision.BF16, "unpadded": False}, False),  # --padded
        ({"precision": Precision.BF16, "unpadded": True, "tensor_parallel": 2}, True),  # asked for, and it runs
    ],
)
def test_unpadded_wherever_it_can_run_on_gpus(gpu_with_varlen, given, expected):
    assert predict._unpadded(RunSettings(**given)) is expected


@pytest.mark.parametrize(
    "given",
    [
        {"precision": Precision.FP32, "unpadded": True},
        {"precision": Precision.BF16, "unpadded": True, "pipeline_parallel": 2},
        {"precision": Precision.BF16, "unpadded": True, "context_parallel": 2},
    ],
)
def test_asked_for_where_it_cannot_run_is_refused(gpu_with_varlen, given):
    with pytest.raises(SettingsError, match="--unpadded needs CUDA GPUs"):
        predict._unpadded(RunSettings(**given))


def test_cpu_runs_pad_without_asking_torch(monkeypatch):
    monkeypatch.setattr(trainers, "accelerator", lambda settings: "cpu")
    monkeypatch.setattr(predict, "_varlen_attention_available", lambda precision: pytest.fail("asked torch"))
    assert predict._unpadded(RunSettings(precision=Precision.BF16)) is False
    with pytest.raises(SettingsError, match="--unpadded needs CUDA GPUs"):
        predict._unpadded(RunSettings(precision=Precision.BF16, unpadded=True))
