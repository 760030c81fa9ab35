"""Token-budget batches, shards streamed into one file, resume after kill -9, and bf16 parameters."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.esm2.data import length_sorted_batches
from bionemo.recipes.outputs import assemble_predictions, read_predictions, split_residues
from support.hf_esm import random_hf_esm, random_sequences

runner = CliRunner()


def write_fasta(path, sequences: list[str]):
    path.write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(sequences)))
    return path


def predict(tmp_path, name: str, *args: str):
    out = tmp_path / name
    result = runner.invoke(app, ["run", "predict", "--output-dir", str(out), *args], terminal_width=300)
    return result, out


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(3, 50), min_size=1, max_size=40),
    budget=st.integers(50, 200),
    batch_size=st.none() | st.integers(1, 8),
)
def test_length_sorted_batches_respect_the_budget_and_cover_every_sample_once(lengths, budget, batch_size):
    batches = length_sorted_batches(lengths, tokens_per_batch=budget, batch_size=batch_size)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= budget
        assert batch_size is None or len(batch) <= batch_size
    flat = [lengths[i] for batch in batches for i in batch]
    assert flat == sorted(lengths, reverse=True)  # longest first, so an out-of-memory shows at once


def test_length_sorted_batches_refuse_a_budget_below_the_longest_sample():
    with pytest.raises(ValueError, match="less than the longest sample's 12 tokens"):
        length_sorted_batches([5, 12, 3], tokens_per_batch=10)


def test_micro_batches_and_token_budgets_give_the_same_outputs(tmp_path):
    random_hf_esm(tmp_path / "hf")
    sequences = random_sequences(9, seed=11)
    fasta = write_fasta(tmp_path / "in.fasta", sequences)
    common = ["--checkpoint", str(tmp_path / "hf"), "--data", str(fasta), "--include", "embeddings",
              "--include", "perplexity", "--include", "logits", "--include", "residue-embeddings"]  # fmt: skip
    budget = str(3 * (max(map(len, sequences)) + 2))
    batchings = {"mbs1": ["--micro-batch-size", "1"], "mbs4": ["--micro-batch-size", "4"],
                 "tokens": ["--tokens-per-batch", budget]}  # fmt: skip
    runs = {}
    for name, batching in batchings.items():
        result, out = predict(tmp_path, name, *common, *batching)
        assert result.exit_code == 0, result.output + repr(result.exception)
        runs[name] = read_predictions(out / "predictions.safetensors")
    assert runs["tokens"][0] == [f"s{i}" for i in range(9)]
    for name in ("mbs4", "tokens"):
        for key in ("embeddings", "perplexity", "logits", "residue_embeddings"):
            torch.testing.assert_close(runs[name][1][key], runs["mbs1"][1][key], rtol=1e-5, atol=1e-5, msg=key)


def test_a_token_budget_below_the_longest_sequence_is_refused(tmp_path):
    fasta = write_fasta(tmp_path / "in.fasta", ["MKV", "MKTAYIAKQR"])
    result, out = predict(tmp_path, "small", "--data", str(fasta), "--tokens-per-batch", "8")
    assert result.exit_code == 2
    text = " ".join(result.output.replace("│", " ").split())
    assert "--tokens-per-batch 8 is less than sequence s1's 12 tokens" in text
    assert "give at least 12" in text
    assert not (out / "predictions.safetensors").exists()


def shard(path, index, **tensors):
    save_file({"sample_index": torch.tensor(index), **tensors}, str(path))
    return path


def test_assemble_streams_shards_into_input_order_and_reads_lazily(tmp_path):
    lengths = [3, 1, 2]
    h = 2
    residues = [torch.arange(n * h, dtype=torch.float32).reshape(n, h) + 10 * i for i, n in enumerate(lengths)]
    padded = torch.zeros(3, 3, h)
    for i, r in enumerate(residues):
        padded[i, : len(r)] = r
    logits = [torch.full((n + 2, 4), float(i)) for i, n in enumerate(lengths)]
    shards = [
        shard(tmp_path / "b.safetensors", [2, 0], embeddings=torch.tensor([[2.0, 2], [0, 0]]),
              residue_embeddings=padded[[2, 0]], logits=torch.stack([torch.cat([logits[2], torch.zeros(1, 4)]),
                                                                     logits[0]])),
        shard(tmp_path / "a.safetensors", [1, 2], embeddings=torch.tensor([[1.0, 1], [9, 9]]),
              residue_embeddings=padded[[1, 2], :2], logits=torch.stack([torch.cat([logits[1], torch.zeros(1, 4)]),
                                                                         logits[2]])),
    ]  # fmt: skip
    path = assemble_predictions(tmp_path / "out.safetensors", shards, lengths, ["x", "y", "z"], {"recipe": '"r"'})
    ids, out = read_predictions(path)
    assert ids == ["x", "y", "z"]
    assert out["sample_index"].tolist() == [0, 1, 2]
    assert out["embeddings"].tolist() == [[0, 0], [1, 1], [2, 2]]  # row 2 from the first shard that holds it
    assert out["residue_offsets"].tolist() == [0, 3, 4, 6]
    for got, expected in zip(split_residues(out), residues, strict=True):
        assert torch.equal(got, expected)
    assert out["logits"].shape == (3, 5, 4)
    for i, n in enumerate(lengths):
        assert torch.equal(out["logits"][i, : n + 2], logits[i])
        assert out["logits"][i, n + 2 :].eq(0).all()
    with safe_open(str(path), framework="pt") as f:  # any rows without loading the rest
        assert torch.equal(f.get_slice("residue_embeddings")[4:6], residues[2])
        assert json.loads(f.metadata()["recipe"]) == "r"
    with pytest.raises(ValueError, match="1 of 4 inputs are in no prediction shard"):
        assemble_predictions(tmp_path / "bad.safetensors", shards, [*lengths, 2], list("wxyz"), {})
    assert not (tmp_path / "bad.safetensors").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.multiprocess
def test_prediction_killed_mid_way_resumes_to_the_same_file(tmp_path):
    sequences = random_sequences(240, seed=4, low=30, high=120)
    fasta = write_fasta(tmp_path / "in.fasta", sequences)
    args = ["run", "predict", "--data", str(fasta), "--tokens-per-batch", "300", "--accelerator", "cpu",
            "--include", "embeddings", "--include", "residue-embeddings", "--include", "perplexity"]  # fmt: skip
    command = [sys.executable, "-m", "bionemo.cli", *args]
    straight = tmp_path / "straight"
    subprocess.run([*command, "--output-dir", str(straight)], check=True, capture_output=True, cwd=tmp_path)

    killed = tmp_path / "killed"
    process = subprocess.Popen([*command, "--output-dir", str(killed)], cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + 300
    while len(list((killed / "shards").glob("predictions_rank*.safetensors"))) < 5:
        assert process.poll() is None, "prediction ended before it could be killed"
        assert time.time() < deadline, "no shards appeared"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (killed / "predictions.safetensors").exists()
    done = len(list((killed / "shards").glob("predictions_rank*.safetensors")))
    subprocess.run([*command, "--output-dir", str(killed)], check=True, capture_output=True, cwd=tmp_path)

    summary = json.loads((killed / "summary.json").read_text())
    assert 0 < summary["resumed_sequences"] < len(sequences), summary
    assert done >= 5
    assert not (killed / "shards").exists()
    ids_a, a = read_predictions(straight / "predictions.safetensors")
    ids_b, b = read_predictions(killed / "predictions.safetensors")
    assert ids_a == ids_b == [f"s{i}" for i in range(len(sequences))]
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-5, msg=key)


def test_a_rerun_with_other_outputs_does_not_reuse_shards(tmp_path):
    fasta = write_fasta(tmp_path / "in.fasta", random_sequences(4, seed=1))
    result, out = predict(tmp_path, "out", "--data", str(fasta), "--include", "embeddings")
    assert result.exit_code == 0, result.output
    (out / "shards").mkdir()  # an interrupted run's shards, of other outputs
    from bionemo.esm2.recipes.prediction_shards import STAMP

    (out / "shards" / STAMP).write_text(json.dumps({"fingerprint": "another run"}))
    shard(out / "shards" / "predictions_rank0_sample0.safetensors", [0, 1, 2, 3], cls=torch.zeros(4, 64))
    refused, out = predict(tmp_path, "out", "--data", str(fasta), "--include", "embeddings")
    assert refused.exit_code == 2, refused.output
    assert "--overwrite" in refused.output
    result, out = predict(tmp_path, "out", "--data", str(fasta), "--include", "embeddings", "--overwrite")
    assert result.exit_code == 0, result.output
    _, tensors = read_predictions(out / "predictions.safetensors")
    assert set(tensors) == {"sample_index", "embeddings"}
    assert json.loads((out / "summary.json").read_text())["resumed_sequences"] == 0


def test_bf16_parameters_predict_close_to_float32(tmp_path):
    """What GPUs run by default: parameters in bf16 (no autocast); checked here on CPU against float32."""
    random_hf_esm(tmp_path / "hf", hidden=64, heads=4, layers=2)
    fasta = write_fasta(tmp_path / "in.fasta", random_sequences(4, seed=3))
    runs = {}
    for precision in ("32", "bf16-mixed"):
        result, out = predict(tmp_path, precision, "--checkpoint", str(tmp_path / "hf"), "--data", str(fasta),
                              "--precision", precision, "--include", "embeddings", "--include", "logits")  # fmt: skip
        assert result.exit_code == 0, result.output + repr(result.exception)
        runs[precision] = read_predictions(out / "predictions.safetensors")[1]
    cosine = torch.nn.functional.cosine_similarity(runs["32"]["embeddings"], runs["bf16-mixed"]["embeddings"])
    assert cosine.min() > 0.99
    assert runs["bf16-mixed"]["embeddings"].dtype == torch.float32
    assert not torch.equal(runs["32"]["logits"], runs["bf16-mixed"]["logits"])  # bf16 did run
