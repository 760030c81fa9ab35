"""Where the time of ``bionemo run predict``'s loop goes, beyond the model's forward.

Runs the command in this process on the benchmark's workload (a random Hugging Face ESM-2 of ``--shape`` and a
FASTA of ``--sequences`` proteins, as tools/bench_predict.py makes them), with

* Lightning's ``SimpleProfiler``: host seconds per loop hook (data fetch, predict step, callbacks), printed at
  the end; a hook that waits for the GPU shows that wait;
* ``torch.profiler`` over batches ``--trace-from`` to ``--trace-to``: wall time against the summed time of CUDA
  kernels (GPU busy) and the top host operators by self time.

``--sync-debug`` also prints the Python stack of every synchronizing CUDA call in the traced batches
(``torch.cuda.set_sync_debug_mode``), and every run the host time at the end of the first batches (start-up
inside the loop: workers, first kernels).

Usage (one GPU): python tools/profile_predict_loop.py --shape 150m [--sync-debug --sequences 20000 --out DIR] [-- extra
``run predict`` options, e.g. --tokens-per-batch 131072]
CPU smoke: uv run python tools/profile_predict_loop.py --shape demo --sequences 64 --trace-from 1 --trace-to 3
For finding what holds back tools/bench_predict.py's ratio; not a benchmark.
"""

import argparse
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_predict import model_shape, random_proteins, save_random_hf, write_fasta  # noqa: E402


class TraceBatches(pl.Callback):
    """``torch.profiler`` from the start of batch ``first`` to the end of batch ``last - 1``."""

    def __init__(self, first: int, last: int, sync_debug: bool = False) -> None:
        self.first, self.last, self.sync_debug = first, last, sync_debug
        self.profiler: torch.profiler.profile | None = None
        self.wall = 0.0
        self._start = 0.0
        self._loop_start = 0.0
        self.batch_ends: list[float] = []  # host seconds from the loop's start to each batch's end (no syncs)
        self.first_batch_start = 0.0  # host seconds from the loop's start to batch 0's start (its data's wait)
        self._stacks: dict[str, int] = {}

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self._loop_start = time.perf_counter()

    def _show_sync(self, message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        stack = "".join(traceback.format_stack(limit=14)[:-2])
        self._stacks[stack] = self._stacks.get(stack, 0) + 1

    def on_predict_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if batch_idx == 0:
            self.first_batch_start = time.perf_counter() - self._loop_start
        if batch_idx == self.first:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                torch.cuda.synchronize()
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()
            if self.sync_debug and torch.cuda.is_available():
                warnings.showwarning = self._show_sync  # every synchronizing CUDA call: its Python stack
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
            self._start = time.perf_counter()

    def on_predict_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.batch_ends.append(time.perf_counter() - self._loop_start)
        if batch_idx == self.last - 1 and self.profiler is not None:
            if torch.cuda.is_available():
                torch.cuda.set_sync_debug_mode("default")
                torch.cuda.synchronize()
            self.wall = time.perf_counter() - self._start
            self.profiler.__exit__(None, None, None)

    def report(self) -> None:
        if self.profiler is None:
            print("trace: the run had fewer batches than --trace-to")
            return
        events = self.profiler.key_averages()
        gpu_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
        batches = self.last - self.first
        wall_ms, gpu_ms = self.wall * 1e3 / batches, gpu_us / 1e3 / batches
        print(f"\ntrace of batches {self.first}..{self.last - 1}: wall {wall_ms:.1f} ms per batch, CUDA kernels "
              f"{gpu_ms:.1f} ms per batch (GPU busy {gpu_us / 1e6 / self.wall:.0%})")  # fmt: skip
        print(events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70))
        ends = self.batch_ends
        shown = ", ".join(f"{ends[i]:.2f}" for i in (0, 1, 2, 3, 5, 10, 20, -1) if -len(ends) <= i < len(ends))
        print(f"\nhost seconds from the loop's start to the end of batch 0, 1, 2, 3, 5, 10, 20, last ({len(ends)}): "
              f"{shown}; batch 0 started at {self.first_batch_start:.2f} (waiting for its data)")  # fmt: skip
        if self.sync_debug:
            print(f"\nsynchronizing CUDA calls in the traced batches: {sum(self._stacks.values())}")
            for stack, count in sorted(self._stacks.items(), key=lambda item: -item[1]):
                print(f"--- {count} x\n{stack}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="150m")
    parser.add_argument("--sequences", type=int, default=20000)
    parser.add_argument("--trace-from", type=int, default=20)
    parser.add_argument("--trace-to", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--sync-debug", action="store_true", help="print the Python stack of every host-device sync in the trace"
    )
    parser.add_argument("extra", nargs="*", help="more `run predict` options (after --)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="profile-predict-loop-"))
    out.mkdir(parents=True, exist_ok=True)
    folder = out / f"hf-{args.shape}"
    if not folder.exists():
        save_random_hf(folder, model_shape(args.shape), seed=0)
    fasta = write_fasta(out / "proteins.fasta", random_proteins(args.sequences, seed=0))

    from lightning.pytorch.profilers import SimpleProfiler

    import bionemo.recipes.trainers as trainers

    trace = TraceBatches(args.trace_from, args.trace_to, args.sync_debug)
    build = trainers.build_trainer

    def profiled(*a: Any, callbacks: list[Any], **kw: Any) -> Any:
        trainer = build(*a, callbacks=[*callbacks, trace], **kw)
        trainer.profiler = SimpleProfiler(dirpath=str(out), filename="simple")
        return trainer

    trainers.build_trainer = profiled
    from typer.main import get_command

    from bionemo.cli.app import app

    command = ["run", "predict", "--checkpoint", str(folder), "--data", str(fasta), "--include", "embeddings",
               "--output-dir", str(out / "pred"), *args.extra]  # fmt: skip
    start = time.perf_counter()
    get_command(app).main(command, standalone_mode=False)
    print(f"\ncommand: {time.perf_counter() - start:.1f} s in this process (imports excluded)")
    trace.report()
    simple = out / "fit-simple.txt"
    for report in sorted(out.glob("*simple*.txt")):
        print(f"\n{report.name}:\n{report.read_text()[:6000]}")
    if not list(out.glob("*simple*.txt")) and simple.exists() is False:
        print("(no SimpleProfiler report was written)")


if __name__ == "__main__":
    main()
