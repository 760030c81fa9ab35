"""Host cost of NeMo's megatron callback events per training step, as NeMo ships them and with cached_signatures.

Under MegatronStrategy NeMo dispatches about 13 megatron events per step of four micro-batches
(``on_megatron_microbatches_start``, ``on_megatron_microbatch_start`` / ``_end`` per micro-batch, ...) to the
callbacks that define them: in a bionemo run NeMo's ``MegatronOptimizerModule`` (all of them, as no-ops), its
``MegatronDataSampler`` and bionemo's ``MegatronCompatCallback``. ``CallbackConnector.event`` reads each callback's
signature with ``inspect.signature`` on every dispatch; the ``cached_signatures`` work-around reads it once. This
dispatches that sequence of events to those callbacks (a step outside a trainer, so the hooks return at once) with
both versions of ``event`` in one process, alternating, and prints the median host time per step.

Measured 2026-12-01 on the 2-core CPU machine (13 events, 15 callback calls; 4 runs): 358-627 us per step as NeMo
ships, 50-89 us with cached_signatures (7.0-8.0x).

Usage: uv run python tools/bench_callback_events.py [--steps 2000 --micro-batches 4]
"""

import argparse
import statistics
import time
import types
from typing import Any


def step_events(micro_batches: int) -> list[tuple[str, dict[str, Any]]]:
    """The events ``MegatronParallel.forward`` dispatches in one training step, with their keyword arguments."""
    step = types.SimpleNamespace(trainer=None, step_i=0, pl_module=None)  # outside a trainer: hooks return at once
    per_micro_batch = [
        ("on_megatron_microbatch_start", {"step": step, "batch": {}, "forward_callback": None}),
        ("on_megatron_microbatch_end", {"step": step, "batch": {}, "output": None, "forward_callback": None}),
    ]
    ended = {"step": step, "microbatch_outputs": [], "reduced": None}
    return [
        ("on_megatron_microbatches_start", {"step": step}),
        *per_micro_batch * micro_batches,
        ("on_megatron_microbatches_end", {"step": step, "microbatch_outputs": []}),
        ("on_megatron_reduce_microbatches_start", {"step": step, "microbatch_outputs": []}),
        ("on_megatron_reduce_microbatches_end", {**ended, "loss_reduction": None}),
        ("on_megatron_step_end", ended),
    ]


def connector() -> Any:
    """NeMo's ``CallbackConnector`` with the callbacks a bionemo training run registers for megatron events."""
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator
    from megatron.core.optimizer import OptimizerConfig

    from bionemo.lightning import MegatronCompatCallback
    from bionemo.lightning._nemo import CallbackConnector, MegatronDataSampler, MegatronOptimizerModule

    optimizer = MegatronOptimizerModule(config=OptimizerConfig(lr=1e-4, optimizer="adam"))
    sampler = MegatronDataSampler(seq_len=16, micro_batch_size=2, global_batch_size=8, output_log=False)
    init_num_microbatches_calculator(  # the data sampler's step end reads megatron's batch-size calculator
        rank=0, rampup_batch_size=None, global_batch_size=8, micro_batch_size=2, data_parallel_size=1
    )
    return CallbackConnector([optimizer, sampler, MegatronCompatCallback()])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--micro-batches", type=int, default=4)
    a = parser.parse_args()

    from bionemo.core.megatron_env import prepare_megatron_import

    prepare_megatron_import()
    from bionemo.lightning._nemo import CallbackConnector
    from bionemo.lightning.workarounds import cached_signatures

    callbacks, events = connector(), step_events(a.micro_batches)
    listeners = sum(len(callbacks.callbacks.get(name, [])) for name, _ in events)
    variants = {"as NeMo ships": CallbackConnector.event, "cached_signatures": cached_signatures.event}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(a.steps):
        for name, event in variants.items():
            start = time.perf_counter()
            for event_name, kwargs in events:
                event(callbacks, event_name, **kwargs)
            times[name].append(time.perf_counter() - start)
    print(f"{len(events)} events, {listeners} callback calls per step of {a.micro_batches} micro-batches; "
          f"median of {a.steps} steps")  # fmt: skip
    medians = {name: statistics.median(seconds) * 1e6 for name, seconds in times.items()}
    for name, us in medians.items():
        print(f"  {name:18} {us:8.1f} us per step")
    print(f"  saved {medians['as NeMo ships'] - medians['cached_signatures']:.1f} us per step "
          f"({medians['as NeMo ships'] / medians['cached_signatures']:.1f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
