"""Peak host memory of ``bionemo run predict`` with per-residue embeddings, for a small and a 10x larger input.

Each size runs ``bionemo run predict --include residue-embeddings --output-dtype bfloat16 --accelerator cpu``
with the bundled ``esm2-demo`` model (no ``--checkpoint``) as a subprocess, on a FASTA of short random proteins
(uniform lengths, uniform over the 20 amino acids, fixed seed). Measured per run: the peak resident memory of
the whole process tree (psutil, summed over the processes every 0.2 s; shared pages count once per process),
the largest single process's ``ru_maxrss`` (``os.wait4``), the wall time and the size of the file written. The
output grows with the input; the memory should not. Target: the largest peak within 1.2x of the smallest.

Usage: uv run python tools/bench_predict_memory.py [--sizes 20000,200000 --min-length 30 --max-length 60
    --tokens-per-batch 16384 --seed 0 --out DIR]
CPU smoke: uv run python tools/bench_predict_memory.py --sizes 20,200 --tokens-per-batch 2048
Exits 1 if a run failed. Figures: docs/benchmarks.md#prediction-host-memory.
"""

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
MB = 2**20


def write_proteins(path: Path, count: int, low: int, high: int, seed: int) -> int:
    """A FASTA of ``count`` proteins of ``low``-``high`` residues (ids ``seq{i}``); returns the residue count."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(low, high + 1, count)
    letters = np.frombuffer(AMINO_ACIDS.encode(), dtype=np.uint8)
    text = letters[rng.integers(0, len(AMINO_ACIDS), int(lengths.sum()))].tobytes().decode()
    ends = np.cumsum(lengths).tolist()
    with path.open("w") as handle:
        for i, (end, n) in enumerate(zip(ends, lengths.tolist(), strict=True)):
            handle.write(f">seq{i}\n{text[end - n : end]}\n")
    return int(lengths.sum())


def batch_flags(tokens_per_batch: int) -> list[str]:
    """``--tokens-per-batch N`` when ``run predict`` has it, else ``--micro-batch-size 256``."""
    cmd = [sys.executable, "-m", "bionemo.cli", "run", "predict", "--help"]
    wide = {**os.environ, "COLUMNS": "250"}  # rich cuts long option names in a narrow terminal
    help_text = subprocess.run(cmd, capture_output=True, text=True, env=wide).stdout
    if "--tokens-per-batch" in help_text:
        return ["--tokens-per-batch", str(tokens_per_batch)]
    return ["--micro-batch-size", "256"]


def tree_rss(root: psutil.Process) -> int:
    """Resident bytes of ``root`` and all its descendants (0 for those gone meanwhile)."""
    total = 0
    with contextlib.suppress(psutil.Error):
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
    return total


def measure(cmd: list[str], log: Path, interval: float) -> dict[str, Any]:
    """Run ``cmd`` (output to ``log``) while polling its process tree's memory."""
    peak = 0
    start = time.perf_counter()
    with log.open("w") as handle:
        child = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT)
        root = psutil.Process(child.pid)
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, tree_rss(root))
            time.sleep(interval)
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    return {
        "exit_code": child.returncode,
        "wall_s": time.perf_counter() - start,
        "peak_tree_mb": peak / MB,
        "max_single_rss_mb": usage.ru_maxrss * 1024 / MB,  # Linux reports kilobytes
    }


def run_size(count: int, args: argparse.Namespace, flags: list[str]) -> dict[str, Any]:
    fasta = args.out / f"proteins-{count}.fasta"
    residues = write_proteins(fasta, count, args.min_length, args.max_length, args.seed)
    out = args.out / f"predict-{count}"
    shutil.rmtree(out, ignore_errors=True)  # run predict resumes from a previous run's shards
    cmd = [sys.executable, "-m", "bionemo.cli", "run", "predict", "--data", str(fasta), "--output-dir", str(out)]
    cmd += ["--include", "residue-embeddings", "--output-dtype", "bfloat16", "--accelerator", "cpu", *flags]
    result = measure(cmd, out.with_suffix(".log"), args.interval)
    predictions = out / "predictions.safetensors"
    result |= {"sequences": count, "residues": residues, "log": str(out.with_suffix(".log"))}
    result["output_mb"] = predictions.stat().st_size / MB if predictions.exists() else None
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=lambda text: [int(n) for n in text.split(",") if n], default=[20000, 200000])
    parser.add_argument("--min-length", type=int, default=30)
    parser.add_argument("--max-length", type=int, default=60)
    parser.add_argument("--tokens-per-batch", type=int, default=16384)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between memory polls")
    parser.add_argument("--out", type=Path, default=None, help="FASTAs, outputs, logs (default: a new temp dir)")
    args = parser.parse_args()
    if not 1 <= args.min_length <= args.max_length <= 1022:
        parser.error(f"need 1 <= --min-length ({args.min_length}) <= --max-length ({args.max_length}) <= 1022")
    args.out = args.out or Path(tempfile.mkdtemp(prefix="bench_predict_memory_"))
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def main() -> None:
    args = parse_args()
    flags = batch_flags(args.tokens_per_batch)
    print(f"residues {args.min_length}-{args.max_length}; batching: {' '.join(flags)}; out: {args.out}")
    results = [run_size(count, args, flags) for count in args.sizes]
    print(
        f"{'sequences':>10} {'residues':>12} {'output MB':>10} {'peak tree MB':>13} {'max 1 proc MB':>14} {'wall s':>8}"
    )
    for r in results:
        output = "FAILED" if r["exit_code"] else f"{r['output_mb']:.1f}"
        print(
            f"{r['sequences']:>10,} {r['residues']:>12,} {output:>10} {r['peak_tree_mb']:>13.0f} "
            f"{r['max_single_rss_mb']:>14.0f} {r['wall_s']:>8.1f}"
        )
    ok = [r for r in results if not r["exit_code"]]
    for r in results:
        if r["exit_code"]:
            print(f"size {r['sequences']} exited with {r['exit_code']}; see {r['log']}")
    if len(ok) >= 2:
        small, large = min(ok, key=lambda r: r["sequences"]), max(ok, key=lambda r: r["sequences"])
        ratio = large["peak_tree_mb"] / small["peak_tree_mb"]
        grew = large["output_mb"] / small["output_mb"]
        print(f"peak tree memory, largest / smallest input: {ratio:.2f}x (target <= 1.2x); output grew {grew:.1f}x")
    (args.out / "bench_predict_memory.json").write_text(json.dumps(results, indent=1))
    if len(ok) < len(results):
        raise SystemExit(f"bionemo run predict failed for {len(results) - len(ok)} of {len(results)} sizes")


if __name__ == "__main__":
    main()
