"""A random ESM-2 650M-shape Hugging Face model on GPUs: bf16 predictions agree with transformers' on 1 GPU and
under tensor parallelism 2; ``esm2-650m`` trains a few steps on 2 GPUs and its export loads in transformers.

Figures (cosines, wall times) go to ``$BIONEMO_GPU_LOG_DIR/esm2_650m.txt``.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bionemo.recipes.outputs import read_predictions
from support.hf_esm import random_hf_esm, random_sequences

pytestmark = pytest.mark.multi_gpu


def bionemo(args: list[str], log: Path) -> float:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "bionemo.cli", *args], capture_output=True, text=True, timeout=560, check=False
    )
    log.write_text(" ".join(args) + "\n" + result.stdout + "\n" + result.stderr)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def logs() -> Path:
    path = Path(os.environ.get("BIONEMO_GPU_LOG_DIR", "/tmp/bionemo-gpu-logs"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def hf_bf16_embeddings(model, sequences: list[str]) -> torch.Tensor:
    from bionemo.esm2.tokenizer import ProteinTokenizer

    tokenizer = ProteinTokenizer()
    out = []
    with torch.no_grad():
        for sequence in sequences:
            hidden = model(input_ids=tokenizer.encode(sequence)[None].cuda(), output_hidden_states=True).hidden_states
            out.append(hidden[-1][0, 1:-1].float().mean(0).cpu())
    return torch.stack(out)


def test_650m_hf_model_predicts_like_transformers_in_bf16_on_1_gpu_and_tp2(tmp_path, logs):
    from transformers import EsmForMaskedLM

    folder = tmp_path / "hf650m"
    random_hf_esm(folder, hidden=1280, heads=20, layers=33, ffn=5120)
    sequences = random_sequences(32, seed=0, low=50, high=400)
    fasta = tmp_path / "x.fasta"
    fasta.write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(sequences)))
    hf = EsmForMaskedLM.from_pretrained(folder, torch_dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    reference = hf_bf16_embeddings(hf, sequences)
    hf = EsmForMaskedLM.from_pretrained(folder, torch_dtype=torch.float32).cuda().eval()
    exact = hf_bf16_embeddings(hf, sequences)  # fp32 transformers: how far each bf16 run is from the exact values
    del hf
    torch.cuda.empty_cache()
    hf_bf16 = torch.nn.functional.cosine_similarity(reference, exact, dim=-1)
    report = [f"transformers bf16 vs transformers fp32: cosine min {hf_bf16.min():.5f}"]
    converted = tmp_path / "esm650m.safetensors"
    seconds = bionemo(["convert", "from-hf", str(folder), str(converted)], logs / "esm2_650m_from_hf.log")
    report.append(f"convert from-hf: {seconds:.1f} s")
    layouts = {"1gpu": [], "tp2": ["--devices", "2", "--tensor-parallel", "2", "--strategy", "megatron"]}
    for name, layout in layouts.items():
        out = tmp_path / name
        seconds = bionemo(
            ["run", "predict", "--checkpoint", str(folder), "--data", str(fasta), "--precision", "bf16-mixed",
             "--include", "embeddings", "--output-dir", str(out), *layout],
            logs / f"esm2_650m_predict_{name}.log",
        )  # fmt: skip
        _, tensors = read_predictions(out / "predictions.safetensors")
        cosine = torch.nn.functional.cosine_similarity(tensors["embeddings"], reference, dim=-1)
        to_exact = torch.nn.functional.cosine_similarity(tensors["embeddings"], exact, dim=-1)
        report.append(
            f"predict {name} bf16: {seconds:.1f} s wall, cosine vs HF bf16 min {cosine.min():.5f}, "
            f"vs HF fp32 min {to_exact.min():.5f}"
        )
        (logs / "esm2_650m.txt").write_text("\n".join(report) + "\n")
        assert cosine.min() >= 0.999, (name, cosine)


def test_esm2_650m_trains_on_2_gpus_and_its_export_loads_in_transformers(tmp_path, logs):
    from transformers import EsmForMaskedLM

    run = tmp_path / "run"
    seconds = bionemo(
        ["run", "train", "--recipe", "esm2-650m", "--devices", "2", "--max-steps", "4", "--val-check-interval", "4",
         "--micro-batch-size", "8", "--global-batch-size", "16", "--output-dir", str(run)],
        logs / "esm2_650m_train_2gpu.log",
    )  # fmt: skip
    export = tmp_path / "hf"
    bionemo(["convert", "to-hf", str(run / "model.safetensors"), str(export)], logs / "esm2_650m_to_hf.log")
    model = EsmForMaskedLM.from_pretrained(export, torch_dtype=torch.float32).cuda().eval()
    sequences = random_sequences(4, seed=1, low=50, high=200)
    from bionemo.esm2.tokenizer import ProteinTokenizer

    with torch.no_grad():
        logits = model(input_ids=ProteinTokenizer().encode(sequences[0])[None].cuda()).logits
    assert torch.isfinite(logits).all()
    fasta = tmp_path / "y.fasta"
    fasta.write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(sequences)))
    bionemo(
        ["run", "predict", "--checkpoint", str(run / "model.safetensors"), "--data", str(fasta), "--include",
         "embeddings", "--output-dir", str(tmp_path / "pred")],
        logs / "esm2_650m_predict_trained.log",
    )  # fmt: skip
    _, ours = read_predictions(tmp_path / "pred" / "predictions.safetensors")
    theirs = hf_bf16_embeddings(model, sequences)  # fp32 model here despite the name
    cosine = torch.nn.functional.cosine_similarity(ours["embeddings"], theirs, dim=-1)
    with (logs / "esm2_650m.txt").open("a") as f:
        f.write(
            f"train esm2-650m 2 GPUs 4 steps: {seconds:.1f} s wall; export loads in HF, cosine {cosine.min():.6f}\n"
        )
    assert cosine.min() >= 0.9999
