"""How fast `bionemo run train` / `predict` / `finetune` refuse bad input, against `python -c "import torch"`.

Usage: uv run python tools/bench_input_errors.py [--repeat 3]
CPU smoke: uv run python tools/bench_input_errors.py --repeat 1
Figures: docs/benchmarks.md#bad-input-answers.

Target: every bad input answers with exit code 2 within 3 s of wall time, so the checks must run
before torch, lightning, nemo or megatron are imported. Each case runs in a fresh process
(`python -m bionemo.cli ...`) in a scratch folder; the table gives the median wall time, the exit code and whether
the expected message was printed. Exits 1 if a case gave another exit code or message. The fine-tuning cases start
from the bundled checkpoint; one of them needs a fine-tuned model, made first by a 2-step fine-tune (not timed).
"""

import argparse
import gzip
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_SECONDS = 3.0


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _truncated_checkpoint(folder: Path) -> str:
    from bionemo.esm2.recipes import BUNDLED_CHECKPOINT

    data = BUNDLED_CHECKPOINT.read_bytes()
    path = folder / "truncated.safetensors"
    path.write_bytes(data[: len(data) // 2])
    return str(path)


def _safetensors(path: Path, name: str, metadata: dict[str, str]) -> str:
    """A one-tensor safetensors file, written with the standard library (the bench imports no torch)."""
    header = json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "__metadata__": metadata})
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(4))
    return str(path)


def _gzip(path: Path, text: str, *, cut: bool = False) -> str:
    data = gzip.compress(text.encode())
    path.write_bytes(data[: len(data) // 2] if cut else data)
    return str(path)


def _labelled_csv(path: Path, *, kinds: tuple[str, ...] = ("a", "b"), rows: int = 20, spoil: str = "") -> str:
    """A labelled CSV (id, sequence, kind, score, ss); ``spoil``: 'length' cuts row 2's ss, 'number' row 4's score."""
    lines = ["id,sequence,kind,score,ss"]
    for i in range(rows):
        sequence = "MKVLAEDRST"[: 4 + i % 7] * 3
        ss = "HC" * len(sequence)
        ss = ss[: len(sequence) - 2] if spoil == "length" and i == 2 else ss[: len(sequence)]
        score = "high" if spoil == "number" and i == 4 else str(i / rows)
        lines.append(f"s{i},{sequence},{kinds[i % len(kinds)]},{score},{ss}")
    return _write(path, "\n".join(lines) + "\n")


def _finetuned_model(folder: Path, base: str, train: str) -> str:
    """A model fine-tuned from ``base`` for 2 steps (its ``model.safetensors``)."""
    out = folder / "finetuned"
    args = ["--checkpoint", base, "--data", train, "--task", "classification", "--label-column", "kind"]
    subprocess.run(
        [sys.executable, "-m", "bionemo.cli", "run", "finetune", *args, "--output-dir", str(out), "--max-steps", "2"],
        cwd=folder,
        capture_output=True,
        check=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    return str(out / "model.safetensors")


def _training_run(folder: Path) -> str:
    """A training run's folder, as `run train` leaves it once started (its settings.yaml)."""
    folder.mkdir()
    _write(folder / "settings.yaml", "seed: 0\n")
    return str(folder)


def _other_run(folder: Path) -> str:
    """An output folder holding another run's checkpoint (a run of seed 99; the check reads no checkpoint)."""
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"another run's checkpoint")
    _write(folder / "checkpoints" / "run.json", json.dumps({"seed": 99}))
    return str(folder)


def finetune_cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    """The cases of `bionemo run finetune` (name, arguments after `bionemo run`, a piece of the expected message)."""
    from bionemo.esm2.recipes import BUNDLED_CHECKPOINT

    base, train = str(BUNDLED_CHECKPOINT), _labelled_csv(tmp / "labelled.csv")
    (tmp / "bert").mkdir()
    _write(tmp / "bert" / "config.json", json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    classify = ["--task", "classification", "--label-column", "kind"]

    def finetune(*args: str, data: str | None = train, checkpoint: str | None = base) -> list[str]:
        words = ["finetune", *(["--checkpoint", checkpoint] if checkpoint else []), *(["--data", data] if data else [])]
        return [*words, *args, "--output-dir", str(tmp / "finetune_out")]

    token = ["--task", "token-classification", "--label-column", "ss"]
    regress = ["--task", "regression", "--label-column", "score"]
    unseen = _labelled_csv(tmp / "unseen.csv", kinds=("a", "b", "c"), rows=4)
    no_metadata = _safetensors(tmp / "plain.safetensors", "w", {"format": "pt"})
    return [
        (
            "finetune: missing label column",
            finetune("--task", "classification", "--label-column", "nope"),
            "the columns found: ['id', 'sequence', 'kind', 'score', 'ss']",
        ),
        (
            "finetune: token labels, other length",
            finetune(*token, data=_labelled_csv(tmp / "short_ss.csv", spoil="length")),
            "short_ss.csv:4: sequence 's2': 'ss' has 16 label characters but the sequence has 18 residues",
        ),
        (
            "finetune: non-numeric regression label",
            finetune(*regress, data=_labelled_csv(tmp / "text_score.csv", spoil="number")),
            "text_score.csv:6: sequence 's4': 'score' holds 'high', not a finite number",
        ),
        (
            "finetune: one class only",
            finetune(*classify, data=_labelled_csv(tmp / "one_class.csv", kinds=("a",))),
            "hold one class only",
        ),
        ("finetune: --val-data class unseen", finetune(*classify, "--val-data", unseen), "label(s) ['c']"),
        ("finetune: unknown --task", finetune("--task", "nope", "--label-column", "kind"), "is not one of"),
        ("finetune: unknown --head", finetune(*classify, "--head", "nope"), "is not one of 'hf', 'mlp', 'conv'"),
        (
            "finetune: --head hf, token-regression",
            finetune("--task", "token-regression", "--label-column", "ss", "--head", "hf"),
            "valid for token-regression: conv",
        ),
        ("finetune: --lora-rank, encoder full", finetune(*classify, "--lora-rank", "4"), "add --encoder lora"),
        (
            "finetune: --class-weights, regression",
            finetune(*regress, "--class-weights", "balanced"),
            "--task regression has none",
        ),
        ("finetune: --best-metric not logged", finetune(*regress, "--best-metric", "mcc"), "logs mse, pearson"),
        ("finetune: BERT folder as base", finetune(*classify, checkpoint=str(tmp / "bert")), "model_type 'bert'"),
        ("finetune: .safetensors, no metadata", finetune(*classify, checkpoint=no_metadata), "no model config"),
        ("finetune: empty CSV", finetune(*classify, data=_write(tmp / "empty.csv", "")), "is empty"),
        (
            "finetune: FASTA as --data",
            finetune(*classify, data=_write(tmp / "labels.fasta", ">a\nMKVLA\n")),
            "cannot carry labels",
        ),
        ("finetune: no --checkpoint", finetune(*classify, checkpoint=None), "give --checkpoint"),
        ("finetune: no --task", finetune("--label-column", "kind"), "fine-tuning needs --task"),
        ("finetune: no --data", finetune(*classify, data=None), "fine-tuning needs labelled data"),
        ("finetune: --pipeline-parallel 2", finetune(*classify, "--pipeline-parallel", "2"), "at 1"),
        (
            "finetune: fine-tuned model as base",
            finetune(*classify, checkpoint=_finetuned_model(tmp, base, train)),
            "is a fine-tuned model",
        ),
        (
            "finetune: unknown --lora-targets",
            finetune(*classify, "--encoder", "lora", "--lora-targets", "nope"),
            "valid are qkv, proj, fc1, fc2",
        ),
        (
            "finetune: --mask-column, sequence task",
            finetune(*classify, "--mask-column", "ss"),
            "applies to the per-residue tasks",
        ),
        (
            "finetune: another run's checkpoints",
            [*finetune(*classify), "--output-dir", _other_run(tmp / "other_finetune")],
            "holds the checkpoints of another run",
        ),
    ]


def cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    """(name, arguments after `bionemo run`, a piece of the expected message)."""
    (tmp / "nohf").mkdir()
    (tmp / "garbage.safetensors").write_bytes(b"\x00\x01 not a safetensors file")
    too_long = f">big\n{'A' * 1100}\n"
    fasta = ">a\nMKVLA\n"
    (tmp / "earlier").mkdir()
    earlier = Path(_safetensors(tmp / "earlier" / "predictions.safetensors", "embeddings", {"ids": '["x"]'}))
    return [
        ("predict: missing --data", ["predict", "--data", str(tmp / "missing.fasta")], "does not exist"),
        ("predict: empty FASTA", ["predict", "--data", _write(tmp / "empty.fasta", "")], "holds no sequences"),
        ("predict: FASTA without header", ["predict", "--data", _write(tmp / "nohead.fasta", "MKV\n")], "first '>'"),
        ("predict: bad characters", ["predict", "--data", _write(tmp / "bad.fasta", ">a\nMKV1Z\n")], "['1']"),
        ("predict: too long, no --truncate", ["predict", "--data", _write(tmp / "long.fasta", too_long)], "--truncate"),
        ("predict: CSV without sequence", ["predict", "--data", _write(tmp / "x.csv", "id,seq\na,M\n")], "'sequence'"),
        ("predict: missing --checkpoint", ["predict", "--checkpoint", str(tmp / "nope.safetensors")], "does not exist"),
        (
            "predict: corrupt --checkpoint",
            ["predict", "--checkpoint", str(tmp / "garbage.safetensors")],
            "not a readable safetensors file",
        ),
        (
            "predict: truncated --checkpoint",
            ["predict", "--checkpoint", _truncated_checkpoint(tmp)],
            "not a readable safetensors file",
        ),
        ("predict: HF folder, no config", ["predict", "--checkpoint", str(tmp / "nohf")], "config.json"),
        ("predict: unknown recipe", ["predict", "--recipe", "nope"], "unknown recipe 'nope'"),
        (
            "predict: HF model.safetensors file",
            ["predict", "--checkpoint", _safetensors(tmp / "model.safetensors", "esm.x", {"format": "pt"})],
            "is a Hugging Face weights file",
        ),
        (
            "predict: another run's predictions",
            ["predict", "--output-dir", str(earlier.parent)],
            "--overwrite",
        ),
        (
            "predict: a training run's folder",
            ["predict", "--output-dir", _training_run(tmp / "trained")],
            "is a training run's folder",
        ),
        (
            "predict: truncated .fasta.gz",
            ["predict", "--data", _gzip(tmp / "cut.fasta.gz", fasta * 50, cut=True)],
            "ends before its gzip stream",
        ),  # fmt: skip
        ("predict: .fasta.gz not gzip", ["predict", "--data", _write(tmp / "plain.fasta.gz", fasta)], "not gzip"),
        ("predict: bad characters, .gz", ["predict", "--data", _gzip(tmp / "bad.fasta.gz", ">a\nMKV1\n")], "['1']"),
        ("predict: contacts, no contact head", ["predict", "--include", "contacts"], "has no contact head"),
        ("predict: Parquet", ["predict", "--data", _write(tmp / "s.parquet", "PAR1")], "is Parquet"),
        (
            "predict: --output-dir is a file",
            ["predict", "--output-dir", _write(tmp / "afile", "x")],
            "is an existing file",
        ),
        ("predict: --output-dir below a file", ["predict", "--output-dir", str(tmp / "afile" / "sub")], "cannot be"),
        ("predict: --layer out of range", ["predict", "--layer", "9"], "--layer 9"),
        ("predict: --accelerator gpu on CPU", ["predict", "--accelerator", "gpu"], "no CUDA GPU"),
        ("train: devices % TP x PP x CP", ["train", "--devices", "3", "--tensor-parallel", "2"], "not divisible"),
        ("train: missing --data", ["train", "--data", str(tmp / "missing.fasta")], "does not exist"),
        ("train: one sequence", ["train", "--data", _write(tmp / "one.fasta", ">a\nMKV\n")], "at least 2"),
        ("train: missing --checkpoint", ["train", "--checkpoint", str(tmp / "nope")], "does not exist"),
        ("train: unknown config key", ["train", "--config", _write(tmp / "c.yaml", "devicez: 2\n")], "devicez"),
        ("train: --devices 0", ["train", "--devices", "0"], "--devices"),
        (
            "train: another run's checkpoints",
            ["train", "--output-dir", _other_run(tmp / "other_train")],
            "holds the checkpoints of another run",
        ),
        *finetune_cases(tmp),
    ]


def run_case(args: list[str], cwd: Path) -> tuple[float, int, str]:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "bionemo.cli", "run", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "400"},
    )
    seconds = time.perf_counter() - start
    text = " ".join((result.stdout + result.stderr).replace("│", " ").split())
    return seconds, result.returncode, text


def timed_import_torch(repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the median is shown")
    args = parser.parse_args()
    torch_seconds = timed_import_torch(args.repeat)
    failures = 0
    worst = 0.0
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        print(f"{'case':38} {'median s':>9} {'exit':>5} {'message':>8}")
        for name, case_args, message in cases(tmp):
            samples, codes, found = [], set(), True
            for _ in range(args.repeat):
                seconds, code, text = run_case(case_args, tmp)
                samples.append(seconds)
                codes.add(code)
                found = found and message in text
            seconds = statistics.median(samples)
            worst = max(worst, seconds)
            ok = codes == {2} and found
            failures += not ok
            shown_code = ",".join(str(c) for c in sorted(codes))
            print(f"{name:38} {seconds:9.2f} {shown_code:>5} {'ok' if found else 'MISSING':>8}")
    verdict = "within" if worst <= TARGET_SECONDS else "OVER"
    print(f"\nslowest case: {worst:.2f} s ({verdict} the {TARGET_SECONDS:.0f} s target)")
    print(f"python -c 'import torch' (reference, same run): {torch_seconds:.2f} s")
    if failures:
        print(f"{failures} case(s) gave another exit code or message")
        sys.exit(1)


if __name__ == "__main__":
    main()
