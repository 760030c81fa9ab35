"""Where the wall time of one short ``bionemo run predict`` goes: start-up phases, imports, exit.

Target: 32 sequences in <= 8 s on 1 GPU (<= 10 s on the 2-core CPU machine) from command to exit. Builds a
random Hugging Face ESM-2 folder of ``--shape`` (tools/bench_predict.py ``save_random_hf``, seeded, nothing
downloaded) and a FASTA of ``--sequences`` random proteins (``random_proteins``), then

1. runs ``python -m bionemo.cli run predict --checkpoint HF_DIR --data F.fasta --include embeddings`` plainly
   ``--repeat`` times and prints each wall time (the first run of a fresh install also compiles bytecode) with the
   phases the command's ``summary.json`` timed (inputs, ``import torch`` included; the Trainer's environment; the
   model's set-up; the loop; writing) and the rest (interpreter start, the CLI's imports, exit);
2. runs it once more in a child that arms what the entry point arms (``bionemo.cli.app.skip_unused_imports``),
   stamps the time, profiles the command (cProfile, kept as ``predict.prof`` with ``--dir``) and logs its imports
   (``-X importtime``), and prints a phase table: interpreter start, each phase of the command (cumulative,
   its imports included), the exit after the command, and the import time per top-level package.

Usage: python tools/bench_predict_startup.py [--shape 150m] [--sequences 32] [--repeat 2] [--dir DIR]
    [--top 15] [-- extra predict flags, e.g. --accelerator cpu]
CPU smoke: uv run python tools/bench_predict_startup.py --shape demo --sequences 4 --repeat 1 -- --accelerator cpu
Figures only; a profiled run is slower than a plain one (the table also prints both totals). Figures:
docs/benchmarks.md#prediction-start-up.
"""

import argparse
import json
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

PHASES = (  # (label, file suffix, function name): cumulative time of that function in the profile
    ("CLI command (all below)", "bionemo/cli/run.py", "_run"),
    ("  read + check checkpoint (torch import included)", "bionemo/esm2/recipes/inputs.py", "checked_checkpoint"),
    ("  read sequences", "bionemo/esm2/data/readers.py", "read_sequences"),
    ("  _predict (all below but the checks)", "bionemo/esm2/recipes/predict.py", "_predict"),
    ("  _run_prediction (all below)", "bionemo/esm2/recipes/predict.py", "_run_prediction"),
    ("    build Trainer", "bionemo/recipes/trainers.py", "build_trainer"),
    ("    trainer.predict (all below)", "lightning/pytorch/trainer/trainer.py", "predict"),
    ("      configure_model: build + weights", "bionemo/lightning/module.py", "configure_model"),
    ("        build model (megatron)", "bionemo/esm2/model/esm2.py", "configure_model"),
    ("        apply weights", "bionemo/esm2/recipes/predict.py", "_load_weights"),
    ("      model parallel init", "bionemo/lightning/_parallel_init.py", "ensure_model_parallel"),
    ("      strategy setup (move to device)", "lightning/pytorch/strategies/strategy.py", "setup"),
    ("      prediction loop (data workers included)", "lightning/pytorch/loops/prediction_loop.py", "run"),
    ("        predict steps", "lightning/pytorch/loops/prediction_loop.py", "_predict_step"),
    ("  assemble predictions.safetensors", "bionemo/recipes/outputs.py", "assemble_predictions"),
    ("  summary", "bionemo/esm2/recipes/predict.py", "_summarize"),
)


def _child(stamps: Path, profile: Path, argv: list[str]) -> None:
    """Runs in the profiled child: the command as ``bionemo`` runs it, with time stamps and its cProfile."""
    import cProfile

    start = time.time()
    from bionemo.cli import app as cli

    profiler = cProfile.Profile()
    stamp: dict[str, float] = {"start": start, "code": 0}
    skip_unused_imports = getattr(cli, "skip_unused_imports", None)  # what the entry point arms, where it has it
    if skip_unused_imports is not None:
        skip_unused_imports()

    def command() -> None:
        profiler.enable()
        try:
            cli.app(argv, prog_name="bionemo")
        except SystemExit as stop:
            stamp["code"] = stop.code if isinstance(stop.code, int) else 1
            raise
        finally:
            profiler.disable()
            stamp["end"] = time.time()
            profiler.dump_stats(str(profile))
            stamps.write_text(json.dumps(stamp))

    try:  # the entry point's exit without the interpreter's teardown, where this version has it
        from bionemo.cli._fast_exit import run_then_exit_fast
    except ImportError:
        command()
    else:
        run_then_exit_fast(command)


def _cumulative(stats: pstats.Stats, suffix: str, name: str) -> float | None:
    times = [v[3] for (file, _, func), v in stats.stats.items() if func == name and file.endswith(suffix)]  # type: ignore[attr-defined]
    return max(times) if times else None


def _imports(log: str) -> tuple[float, dict[str, float]]:
    """Total import seconds (top-level imports' cumulative) and self seconds per top-level package."""
    total, per_package = 0.0, defaultdict(float)
    for line in log.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if not match:
            continue
        self_us, cumulative_us, depth, name = int(match[1]), int(match[2]), len(match[3]), match[4]
        per_package[name.split(".")[0]] += self_us / 1e6
        if depth == 1:
            total += cumulative_us / 1e6
    return total, per_package


def _command(hf: Path, fasta: Path, out: Path, extra: list[str]) -> list[str]:
    return ["run", "predict", "--checkpoint", str(hf), "--data", str(fasta), "--output-dir", str(out),
            "--include", "embeddings", *extra]  # fmt: skip


def _plain(args: list[str], out: Path) -> tuple[float, dict[str, float | None]]:
    """The command's wall time and the phases its ``summary.json`` timed (None where it timed none)."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bionemo.cli", *args], check=True, capture_output=True)
    wall = time.perf_counter() - start
    from bench_predict import summary_phases

    return wall, summary_phases(json.loads((out / "summary.json").read_text()))


def _profiled(args: list[str], out: Path, work: Path, top: int) -> None:
    shutil.rmtree(out, ignore_errors=True)
    stamps, profile = work / "stamps.json", work / "predict.prof"
    child = [sys.executable, "-X", "importtime", __file__, "--child", str(stamps), str(profile), "--", *args]
    launched = time.time()
    done = subprocess.run(child, capture_output=True, text=True)
    finished = time.time()
    stamp = json.loads(stamps.read_text())
    if stamp["code"]:
        raise SystemExit(f"the profiled run failed ({stamp['code']}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    stats = pstats.Stats(str(profile))
    imports, per_package = _imports(done.stderr)
    print(f"\nprofiled run ({finished - launched:.1f} s wall)")
    print(f"{'phase':54} {'seconds':>8}")
    print(f"{'python start (interpreter, site)':54} {stamp['start'] - launched:8.2f}")
    command = stamp["end"] - stamp["start"]
    print(f"{'command (profiled; typer app import included)':54} {command:8.2f}")
    for label, suffix, name in PHASES:
        seconds = _cumulative(stats, suffix, name)
        print(f"{label:54} {'-' if seconds is None else f'{seconds:8.2f}':>8}")
    print(f"{'exit after the command':54} {finished - stamp['end']:8.2f}")
    print(f"{'imports, all (top-level cumulative, also inside phases)':54} {imports:8.2f}")
    print(f"\nimport self time per top-level package (top {top})")
    for package, seconds in sorted(per_package.items(), key=lambda item: -item[1])[:top]:
        print(f"  {package:30} {seconds:6.2f}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[5:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shape", default="150m", help="demo, 8m, 35m, 150m, 650m, ...")
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2, help="plain (unprofiled) runs")
    parser.add_argument("--dir", type=Path, default=None, help="keep the model, FASTA and outputs here")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("extra", nargs="*", help="more `run predict` flags, after --")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_predict import SUMMARY_PHASES, model_shape, random_proteins, save_random_hf, write_fasta

    work = args.dir or Path(tempfile.mkdtemp(prefix="bench_predict_startup."))
    work.mkdir(parents=True, exist_ok=True)
    hf, fasta, out = work / f"hf_{args.shape}", work / "sequences.fasta", work / "out"
    if not (hf / "config.json").is_file():
        save_random_hf(hf, model_shape(args.shape), seed=0)
    write_fasta(fasta, random_proteins(args.sequences, seed=0))
    command = _command(hf, fasta, out, args.extra)
    print(f"bionemo {' '.join(command)}")
    no_pyc, prefix = os.environ.get("PYTHONDONTWRITEBYTECODE"), os.environ.get("PYTHONPYCACHEPREFIX")
    bytecode = f"PYTHONDONTWRITEBYTECODE={no_pyc}, PYTHONPYCACHEPREFIX={prefix}"
    print(f"plain runs, seconds ({bytecode}); rest: interpreter start, imports, exit")
    print(f"{'run':5} {'wall':>7}" + "".join(f" {name:>19}" for name in SUMMARY_PHASES) + f" {'rest':>7}")
    for i in range(args.repeat):
        wall, phases = _plain(command, out)
        timed = [seconds for seconds in phases.values() if seconds is not None]
        cells = "".join(f" {'-' if s is None else f'{s:.2f}':>19}" for s in phases.values())
        print(f"{i + 1:<5} {wall:7.2f}{cells} {wall - sum(timed):7.2f}")
    _profiled(command, out, work, args.top)
    if args.dir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
