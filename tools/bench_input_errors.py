"""How fast `bionemo run train` / `bionemo run predict` refuse bad input, against `python -c "import torch"`.

Usage: uv run python tools/bench_input_errors.py [--repeat 3]
Target (project issue 11): every bad input answers with exit code 2 within 3 s of wall time, so the checks must run
before torch, lightning, nemo or megatron are imported. Each case runs in a fresh process
(`python -m bionemo.cli ...`) in a scratch folder; the table gives the median wall time, the exit code and whether
the expected message was printed. Exits 1 if a case gave another exit code or message.
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
