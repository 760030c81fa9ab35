"""Real runs of the `bionemo` command in subprocesses: the README's predict, training, resume after kill -9."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from bionemo.esm2.checkpoints.weights import read_metadata
from bionemo.esm2.data.readers import read_sequences
from bionemo.esm2.recipes import BUNDLED_SEQUENCES
from bionemo.recipes.outputs import read_predictions
from support.cli_runs import BIONEMO, CPU_ONLY, bionemo, bionemo_refused


def test_readme_predict_with_no_arguments(tmp_path):
    result = bionemo("run", "predict", cwd=tmp_path)
    out = tmp_path / "bionemo_predictions"
    ids, tensors = read_predictions(out / "predictions.safetensors")
    expected = [record.id for record in read_sequences(BUNDLED_SEQUENCES)]
    assert ids == expected
    assert tensors["sample_index"].tolist() == list(range(len(expected)))
    assert tensors["embeddings"].shape == (len(expected), 64)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sequences"] == len(expected)
    # the bundled model learned the families: far better than a uniform guess over 20 amino acids
    assert summary["mean_perplexity"] < 10
    assert float(tensors["perplexity"].mean()) == pytest.approx(summary["mean_perplexity"], rel=1e-5)
    assert "mean masked-token perplexity" in result.stdout
    assert not (out / "shards").exists()
    # a rerun with other outputs into the same directory replaces the results with --overwrite: same rows, no duplicates
    bionemo("run", "predict", "--include", "perplexity", "--overwrite", cwd=tmp_path)
    ids_again, again = read_predictions(out / "predictions.safetensors")
    assert ids_again == expected
    assert "embeddings" not in again
    torch.testing.assert_close(again["perplexity"], tensors["perplexity"])


TRAIN = ["run", "train", "--max-steps", "40", "--val-check-interval", "10", "--seed", "3"]


def weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path)


@pytest.mark.slow
def test_resume_after_kill_matches_an_uninterrupted_run(tmp_path):
    straight = tmp_path / "straight"
    bionemo(*TRAIN, "--output-dir", str(straight), cwd=tmp_path)
    assert (straight / "training_curves.png").exists()
    assert (straight / "logs" / "metrics.csv").exists()

    killed = tmp_path / "killed"
    process = subprocess.Popen(
        [*BIONEMO, *TRAIN, "--output-dir", str(killed)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=CPU_ONLY,
    )
    deadline = time.time() + 300
    while not (killed / "checkpoints" / "last.ckpt").exists():
        assert process.poll() is None, "training ended before it could be killed"
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (killed / "model.safetensors").exists()
    resumed = bionemo(*TRAIN, "--output-dir", str(killed), cwd=tmp_path)
    assert f"resuming from {killed / 'checkpoints' / 'last.ckpt'}\n" in resumed.stderr

    a, b = weights(straight / "model.safetensors"), weights(killed / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)

    # another run (another seed: other masks, split and order) into that folder is refused, and nothing is written
    files = {path: path.stat().st_mtime_ns for path in killed.rglob("*")}
    message = bionemo_refused(*TRAIN, "--output-dir", str(killed), "--seed", "4", cwd=tmp_path)
    assert f"--output-dir {killed} holds the checkpoints of another run (last.ckpt)" in message
    assert "seed 3 -> 4." in message
    assert {path: path.stat().st_mtime_ns for path in killed.rglob("*")} == files


@pytest.mark.multiprocess
def test_two_process_cpu_ddp_train_and_predict_in_input_order(tmp_path):
    out = tmp_path / "ddp"
    bionemo(
        "run", "train", "--devices", "2", "--accelerator", "cpu", "--max-steps", "20", "--val-check-interval", "10",
        "--output-dir", str(out), cwd=tmp_path,
    )  # fmt: skip
    metadata = read_metadata(out / "model.safetensors")
    assert metadata["steps"] == 20
    fasta = tmp_path / "odd.fasta"
    records = read_sequences(BUNDLED_SEQUENCES)[:13]  # odd count: the sampler pads one rank with a repeat
    fasta.write_text("".join(f">{r.id}\n{r.sequence}\n" for r in records))
    bionemo(
        "run", "predict", "--devices", "2", "--accelerator", "cpu", "--checkpoint", str(out / "model.safetensors"),
        "--data", str(fasta), "--output-dir", str(tmp_path / "pred"), "--micro-batch-size", "4",
        "--include", "embeddings", "--include", "perplexity", "--include", "residue-embeddings", "--layer", "1",
        cwd=tmp_path,
    )  # fmt: skip
    ids, tensors = read_predictions(tmp_path / "pred" / "predictions.safetensors")
    assert ids == [r.id for r in records]
    assert tensors["sample_index"].tolist() == list(range(13))
    # the same predictions from one process
    bionemo(
        "run", "predict", "--accelerator", "cpu", "--checkpoint", str(out / "model.safetensors"),
        "--data", str(fasta), "--output-dir", str(tmp_path / "single"),
        "--include", "embeddings", "--include", "perplexity", "--include", "residue-embeddings", "--layer", "1",
        cwd=tmp_path,
    )  # fmt: skip
    _, single = read_predictions(tmp_path / "single" / "predictions.safetensors")
    assert tensors.keys() == single.keys()
    for key in ("perplexity", "embeddings", "embeddings.layer1", "residue_embeddings", "residue_embeddings.layer1"):
        torch.testing.assert_close(tensors[key], single[key], rtol=1e-4, atol=1e-5, msg=key)
    assert torch.equal(tensors["residue_offsets"], single["residue_offsets"])


@pytest.mark.multiprocess
def test_two_process_cpu_predict_of_fewer_batches_than_ranks(tmp_path):
    """Three sequences fit one batch and one sequence fills none of two ranks: both predict as one process does."""
    records = read_sequences(BUNDLED_SEQUENCES)[:3]
    runs = {}
    for name, chosen, devices in (("three", records, "2"), ("one", records[1:2], "2"), ("single", records, "1")):
        fasta = tmp_path / f"{name}.fasta"
        fasta.write_text("".join(f">{r.id}\n{r.sequence}\n" for r in chosen))
        bionemo(
            "run", "predict", "--devices", devices, "--accelerator", "cpu", "--data", str(fasta),
            "--output-dir", str(tmp_path / name), cwd=tmp_path,
        )  # fmt: skip
        runs[name] = read_predictions(tmp_path / name / "predictions.safetensors")
    (single_ids, single), (three_ids, three), (one_ids, one) = runs["single"], runs["three"], runs["one"]
    assert three_ids == single_ids == [r.id for r in records]
    assert one_ids == [records[1].id]
    for key in ("perplexity", "embeddings"):
        torch.testing.assert_close(three[key], single[key], rtol=1e-4, atol=1e-5, msg=key)
        torch.testing.assert_close(one[key], single[key][1:2], rtol=1e-4, atol=1e-5, msg=key)


def test_predict_options_logits_and_batch_interval(tmp_path):
    out = tmp_path / "pred"
    bionemo(
        "run", "predict", "--include", "logits", "--include", "perplexity", "--write-interval", "batch",
        "--micro-batch-size", "5", "--output-dir", str(out), cwd=tmp_path,
    )  # fmt: skip
    ids, tensors = read_predictions(out / "predictions.safetensors")
    records = read_sequences(BUNDLED_SEQUENCES)
    assert ids == [r.id for r in records]
    assert set(tensors) == {"sample_index", "perplexity", "logits"}
    longest = max(len(r.sequence) for r in records) + 2
    logits = tensors["logits"]
    assert logits.shape == (len(records), longest, 33)  # [n, s, v], padded to the longest sequence
    # raw scores at real positions (the unmasked residues are the likeliest tokens); zeros beyond <eos>
    first_len = len(records[0].sequence) + 2
    assert logits[0, :first_len].ne(0).all()
    assert logits[0, first_len:].eq(0).all()
    from bionemo.esm2.tokenizer import ProteinTokenizer

    residues = ProteinTokenizer().encode(records[0].sequence)[1:-1]
    assert (logits[0, 1 : first_len - 1].argmax(-1) == residues).float().mean() > 0.5
    # the perplexity mask depends on the sequence alone: the same per-sequence perplexities as the default run
    default = tmp_path / "default"
    bionemo("run", "predict", "--output-dir", str(default), cwd=tmp_path)
    _, reference = read_predictions(default / "predictions.safetensors")
    torch.testing.assert_close(tensors["perplexity"], reference["perplexity"], rtol=1e-5, atol=1e-5)
