"""Wall time of importing each bionemo package in a fresh interpreter, and which heavy libraries it loads.

Usage: ``uv run python tools/bench_imports.py [--repeats 3]``. Each figure is the median over fresh processes
of ``python -c "import bionemo.X"``; ``import torch`` alone is measured in the same run as the reference.
Target: ``import bionemo.losses`` <= 3 s with no nemo, lightning or megatron module loaded. Figures:
docs/benchmarks.md#package-imports.

CPU smoke: ``uv run python tools/bench_imports.py --repeats 1``
"""

import argparse
import statistics
import subprocess
import sys
import time

PACKAGES = ["core", "collate", "losses", "callbacks", "lightning", "recipes", "esm2", "cli"]
HEAVY = ["torch", "megatron", "lightning", "nemo", "transformers"]
PROBE = "import sys, {module}; print(','.join(h for h in {heavy!r} if h in sys.modules))"


def measure(module: str, repeats: int) -> tuple[float, str]:
    times, loaded = [], ""
    for _ in range(repeats):
        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-c", PROBE.format(module=module, heavy=HEAVY)], capture_output=True, text=True, check=True
        )
        times.append(time.perf_counter() - start)
        loaded = result.stdout.strip()
    return statistics.median(times), loaded


def main() -> None:
    parser = argparse.ArgumentParser(description="Import time of each bionemo package.")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    measure("os", 1)  # warm the file cache
    print(f"{'import':24} {'median s':>9}  heavy libraries loaded")
    for module in ["torch", *(f"bionemo.{name}" for name in PACKAGES)]:
        seconds, loaded = measure(module, args.repeats)
        note = "  <- target <= 3 s, none of nemo/lightning/megatron" if module == "bionemo.losses" else ""
        print(f"{module:24} {seconds:9.2f}  {loaded or '-'}{note}")


if __name__ == "__main__":
    main()
