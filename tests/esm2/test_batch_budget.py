"""The default token budget of prediction batches (no --tokens-per-batch, no --micro-batch-size)."""

import json

from bionemo.esm2.recipes.batch_budget import (
    CPU_TOKENS_PER_BATCH,
    GPU_TOKENS_PER_BATCH,
    MEMORY_SHARE,
    default_tokens_per_batch,
    device_bytes_per_token,
)
from support.cli_runs import bionemo

SHAPE_650M = {"hidden_size": 1280, "ffn_hidden_size": 5120}
GIB = 2**30


def test_cpu_takes_the_fixed_budget_unless_a_sequence_is_longer():
    assert default_tokens_per_batch(SHAPE_650M, [], device_memory=None, longest=300) == CPU_TOKENS_PER_BATCH
    assert default_tokens_per_batch(SHAPE_650M, [], device_memory=None, longest=9000) == 9000


def test_a_large_gpu_takes_the_cap_and_a_small_one_what_its_memory_share_holds():
    assert default_tokens_per_batch(SHAPE_650M, [], device_memory=139 * GIB, longest=1026) == GPU_TOKENS_PER_BATCH
    small = default_tokens_per_batch(SHAPE_650M, [], device_memory=8 * GIB, longest=1026)
    per_token = device_bytes_per_token(SHAPE_650M, [])
    assert small == int(8 * GIB * MEMORY_SHARE) // per_token
    assert small < GPU_TOKENS_PER_BATCH
    # per-residue outputs stay on the device until the batch ends: fewer tokens fit
    residues = default_tokens_per_batch(SHAPE_650M, ["residue-embeddings"], device_memory=8 * GIB, longest=1026)
    assert residues < small
    assert default_tokens_per_batch(SHAPE_650M, [], device_memory=GIB // 64, longest=1026) == 1026  # must fit alone


def test_predict_defaults_to_the_budget_and_micro_batch_size_still_batches_by_count(tmp_path):
    bionemo("run", "predict", "--output-dir", str(tmp_path / "default"), "--accelerator", "cpu", cwd=tmp_path)
    assert json.loads((tmp_path / "default" / "summary.json").read_text())["tokens_per_batch"] == CPU_TOKENS_PER_BATCH
    result = bionemo(
        "run", "predict", "--output-dir", str(tmp_path / "micro"), "--accelerator", "cpu", "--micro-batch-size", "4",
        cwd=tmp_path,
    )  # fmt: skip
    assert json.loads((tmp_path / "micro" / "summary.json").read_text())["tokens_per_batch"] is None
    assert "up to" not in result.stdout
