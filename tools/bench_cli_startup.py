"""How fast `bionemo --help` answers, against a bare Python start-up measured in the same run.

Usage: uv run python tools/bench_cli_startup.py [--repeat 10] [--with-nemo]
CPU smoke: uv run python tools/bench_cli_startup.py --repeat 1
Target: under 0.5 s. ``--with-nemo`` also times `import nemo.lightning`, what an eager CLI would pay. Figures:
docs/benchmarks.md#cli-start-up.
"""

import argparse
import statistics
import subprocess
import sys
import time


def timed(cmd: list[str], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--with-nemo", action="store_true", help="also time `import nemo.lightning` (about 20 s)")
    args = parser.parse_args()
    bare = timed([sys.executable, "-c", "pass"], args.repeat)
    help_ = timed([sys.executable, "-m", "bionemo.cli", "--help"], args.repeat)
    run_help = timed([sys.executable, "-m", "bionemo.cli", "run", "train", "--help"], args.repeat)
    print(f"{'command':36} {'median s':>9} {'x bare python':>14}")
    rows = [("python -c pass", bare), ("bionemo --help", help_), ("bionemo run train --help", run_help)]
    if args.with_nemo:
        rows.append(("python -c 'import nemo.lightning'", timed([sys.executable, "-c", "import nemo.lightning"], 1)))
    for name, seconds in rows:
        print(f"{name:36} {seconds:9.3f} {seconds / bare:14.1f}")


if __name__ == "__main__":
    main()
