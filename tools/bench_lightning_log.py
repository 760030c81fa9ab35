"""Cost of one ``LightningModule.log`` of a scalar in a training step, with and without the fast_metric_to work-around.

NeMo's MegatronStrategy logs six to eight scalars per training step; Lightning 2.4 walks every attribute of
the stored metric on each call to move it to the value's device. ``install_fast_metric_to`` skips that walk
when the metric is already there. Each variant trains a one-layer model on CPU under Lightning in its own
process and times the ``self.log`` calls of each step (median after 20 steps).

Measured 2026-11-30 on the 2-core CPU machine: 172 us per call as Lightning ships, 34 us with the fix.

Usage: uv run python tools/bench_lightning_log.py [--steps 300 --logs 7]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time


def measure(steps: int, logs: int, fast: bool) -> float:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    if fast:
        from bionemo.lightning.megatron_compat import install_fast_metric_to

        install_fast_metric_to()

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.seconds: list[float] = []

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).sum()
            start = time.perf_counter()
            for k in range(logs):
                self.log(f"metric{k}", loss.detach(), prog_bar=True, batch_size=1)
            self.seconds.append((time.perf_counter() - start) / logs)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Module()
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")  # fmt: skip
    trainer.fit(module, DataLoader(TensorDataset(torch.randn(steps, 2)), batch_size=1))
    return statistics.median(module.seconds[20:])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--logs", type=int, default=7, help="self.log calls per step")
    parser.add_argument("--variant", choices=["lightning", "fast_metric_to"], help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.variant:
        print("RESULT " + json.dumps(measure(a.steps, a.logs, a.variant == "fast_metric_to")))
        return
    results = {}
    for variant in ("lightning", "fast_metric_to"):
        argv = [sys.executable, __file__, "--variant", variant, f"--steps={a.steps}", f"--logs={a.logs}"]
        out = subprocess.run(argv, capture_output=True, text=True, check=True)
        line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
        results[variant] = json.loads(line[len("RESULT ") :])
    for variant, seconds in results.items():
        print(f"{variant:14} {seconds * 1e6:8.1f} us per self.log call")
    saved = (results["lightning"] - results["fast_metric_to"]) * 1e6 * a.logs
    print(f"fast_metric_to saves {saved:.0f} us per step of {a.logs} logs")


if __name__ == "__main__":
    main()
