"""Train-step time of BionemoLightningModule under MegatronStrategy against a raw megatron-core loop (1 GPU).

Both train a megatron-core GPTModel of the same shape (local layer spec, bf16, distributed Adam, megatron DDP
with the gradient NaN check that MegatronStrategy turns on) on the same synthetic tokens, read through the
same kind of DataLoader and moved to the GPU by the same data step, with the same micro-batching. The raw
loop runs with the megatron-core speed-ups MegatronCompatCallback applies for the module (multi_tensor_foreach,
the wait-free gradient norm; fused_adam, torch's fused AdamW) and trains the same objective
(``calculate_per_token_loss``, the loss as ``(sum, tokens)``), so the ratio is the layer's own cost.

Both loops run in ONE process, in alternating blocks of ``--block`` steps: the raw loop's blocks run inside a
Lightning callback between two module steps, and are subtracted from that module step's time. At these
sizes a step is bound by the host's Python, not the GPU, and a separate process per loop measured the host,
not the code: the same 816 ``aten::mm`` calls took 24.9 ms of CPU in one process and 41.8 ms in the next, and
one loop's per-process medians spread over 46-78 ms. Prints each loop's median whole-iteration time after
``--warmup`` steps, their ratio, the ratio of each block pair's medians (median and spread), and the median
host time of each phase of a step (see :class:`Phases`) in both loops, to show where the difference lies.
Target (DEVELOPERS.md): the module within 3% of the raw loop.

Measured 2026-11-30 on one H200 (before fast_metric_to): micro-batches of 8 x 256 (defaults): raw 47.6 ms, module
60.8 ms, 1.278x (block pairs 0.93-1.49x); ``--mbs 16 --seq 1024 --steps 60``: raw 93.9 ms, module 99.8 ms,
1.063x (block pairs 1.04-1.07x). 2026-12-01 (NeMo behind the step-runner adapter, blocks counted in optimizer steps):
8 x 256: raw 70.9 ms, module 83.1 ms, 1.172x (block pairs 0.88-1.47x); ``--profile`` found NeMo's per-call
``inspect.signature`` first (now the ``cached_signatures`` work-around). Until then the raw loop averaged
per-micro-batch means while the module trained the global token-weighted mean (a GPU wait per step more). Later the
same day, like for like with ``cached_signatures``: 8 x 256 1.049-1.168x over five runs (1.166x without it),
16 x 1024 1.058x; ``--kernels``: the same GPU work (1,432 vs 1,401 launches, 8.21 vs 8.16 ms per step), so the
difference is host time spread over Lightning's loop and NeMo's ``MegatronParallel``. 2026-12-01, seventh session:
16 x 1024 1.035x (block pairs 1.018-1.052x) and 1.091x in a later run; 8 x 256 1.077-1.128x over eight runs.
``--diagnose``: the same autograd graph (227 nodes per micro-batch), no thread / hook / mode / gc difference; the
module's extra is +0.7-0.8 ms before megatron's schedule, +1.2-1.5 ms after it, +0.3-0.8 ms in the optimizer step,
+0.3 ms after it, and 1-5 ms within the schedule, where the same forwards and backwards differ by up to +-3 ms
from run to run. Eighth session (both loops with ``fused_adam``): 16 x 1024 1.032x (block pairs median 1.028x,
1.011-1.054x), 8 x 256 1.135x.

``--profile`` runs Python's cProfile over the first block of module steps after the warm-up and over the raw
block that follows, and prints the functions whose own (host) time the module adds: where its extra time goes,
by function, with the call counts of both loops (cProfile slows both; compare counts and differences, not totals).
``--profile-phase N`` profiles only phase N of each step (0: before megatron's schedule, 1: the schedule (forward +
backward), 2: after the schedule until the optimizer, 3: optimizer step, 4: after it; see
:class:`Phases`). ``--kernels`` records the GPU kernels of the same blocks (torch.profiler) and prints launches and
GPU time per step of both loops, by kernel, the largest differences first: whether the module launches work the raw
loop does not. ``--diagnose`` prints what decides every op's host
cost in each loop (threads, trace/profile hooks, autocast, torch function/dispatch modes, dynamo's frame callback,
gc state, CUDA memory) and each loop's Python garbage collections per step; ``--gc freeze`` runs both loops over a
``gc.freeze()``-n heap. ``--sampler-log on`` lets NeMo's data sampler log its two metrics every step, as NeMo does by
default (``MegatronDataModule(log_sampler_metrics=True)``); ``alternate`` switches it on and off between module
blocks and prints the module's median step both ways.

Usage (GPU machine): python tools/bench_module_overhead.py [--layers 4 --hidden 512 --mbs 8 --nmb 4 --seq 256]
    [--steps 120 --block 10 --warmup 20] [--profile [--profile-phase 0-4]] [--kernels] [--diagnose] [--gc freeze]
    [--sampler-log off|on|alternate]
"""

import argparse
import cProfile
import functools
import gc
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

SIZES = {"layers": 4, "hidden": 512, "heads": 8, "vocab": 1024, "seq": 256, "mbs": 8, "nmb": 4}
RUN = {"steps": 120, "block": 10, "warmup": 20}


class Phases:
    """Host timestamps within each step, to show where the module's extra time goes (medians per phase).

    A step starts after a GPU sync (the GPU is idle), so "before megatron's schedule" is host time the GPU
    waits through; "after the optimizer step" runs until the next step's start, its sync included.
    """

    NAMES = (
        "before megatron's schedule",
        "the schedule (forward + backward)",
        "after the schedule",
        "optimizer step",
        "after the optimizer step",
    )
    MARKS = ("start", "schedule", "scheduled", "optimizer", "stepped")
    # summed over a step's micro-batches, inside its schedule; the last two with --diagnose: megatron's
    # forward_step (the step function given to the schedule, its data step, model forward and loss) and backward_step
    PARTS: tuple[str, ...] = ("data steps", "model forwards", "megatron forward_step", "megatron backward_step")

    def __init__(self, profile: Callable[[], cProfile.Profile] | None = None, phase: int | None = None) -> None:
        self.marks: dict[str, float] = {}
        self.steps: list[tuple[float, ...]] = []
        # a function, not the Profile: NeMo deep-copies the callback holding this, and a Profile cannot be copied
        self.profile, self.phase = profile, phase
        self.armed = False  # while armed, ``profile()`` runs during phase ``phase`` of each step
        self.profiling = False  # Python 3.12 refuses to enable a Profile twice (the raw loop closes steps twice)
        self.want_state = False  # with --diagnose: record step_state() when the next schedule starts
        self.want_graph = False  # with --diagnose: add backward_state() at the next backward
        self.state: dict[str, str] = {}
        self.parts = dict.fromkeys(self.PARTS, 0.0)
        self.step_parts: list[dict[str, float]] = []

    def timed(self, part: str, call: Callable[[], Any]) -> Any:
        """``call()``, its host time added to this step's ``part``."""
        start = time.perf_counter()
        out = call()
        self.parts[part] += time.perf_counter() - start
        return out

    def mark(self, name: str) -> None:
        """Record ``name`` the first time it happens in this step."""
        if name not in self.marks:
            self.marks[name] = time.perf_counter()
            self._toggle(name)
            if name == "schedule" and self.want_state:
                self.state, self.want_state = step_state(), False

    def close(self, end: float, excluded: float = 0.0) -> None:
        """End the step at ``end`` (less ``excluded`` seconds spent in the other loop), start the next."""
        m = self.marks
        if all(key in m for key in self.MARKS):
            points = [m[key] for key in self.MARKS]
            self.steps.append((*(b - a for a, b in zip(points, points[1:], strict=False)), end - excluded - points[-1]))
            self.step_parts.append(self.parts)
        self.marks = {"start": end}
        self.parts = dict.fromkeys(self.PARTS, 0.0)
        self._toggle("start")

    def arm(self, armed: bool) -> None:
        """Profile phase ``phase`` of each step from now on (from the current one, if it is in it), or stop."""
        self.armed = armed
        if not armed:
            self._switch(False)
        elif self.marks:
            self._toggle(max(self.marks, key=self.marks.__getitem__))  # the phase the step is in

    def _toggle(self, name: str) -> None:
        if self.profile is None or self.phase is None or not self.armed:
            return
        index = self.MARKS.index(name)
        if index == self.phase:
            self._switch(True)
        elif index == (self.phase + 1) % len(self.MARKS):
            self._switch(False)

    def _switch(self, on: bool) -> None:
        if self.profile is not None and on != self.profiling:
            self.profiling = on
            self.profile().enable() if on else self.profile().disable()


def step_state() -> dict[str, str]:
    """What decides the host cost of every op, read as a step's schedule starts (--diagnose compares both loops)."""
    import importlib
    import sys
    import threading

    import torch

    probes: dict[str, Callable[[], object]] = {
        "threads": lambda: sorted(t.name for t in threading.enumerate()),
        "sys.gettrace / getprofile": lambda: (sys.gettrace(), sys.getprofile()),
        "switch interval": sys.getswitchinterval,
        "grad / inference mode": lambda: (torch.is_grad_enabled(), torch.is_inference_mode_enabled()),
        "autocast cuda / cpu": lambda: (torch.is_autocast_enabled("cuda"), torch.is_autocast_enabled("cpu")),
        "anomaly mode": torch.is_anomaly_enabled,
        "autograd profiler": lambda: torch.autograd.profiler._is_profiler_enabled,
        "torch function / dispatch modes": lambda: (
            torch._C._len_torch_function_stack(),
            torch._C._len_torch_dispatch_stack(),
        ),
        "dynamo eval-frame callback": lambda: importlib.import_module(
            "torch._C._dynamo.eval_frame"
        ).get_eval_frame_callback(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled,
        "cuda sync debug mode": torch.cuda.get_sync_debug_mode,
        "gc enabled / threshold / counts": lambda: (gc.isenabled(), gc.get_threshold(), gc.get_count()),
        "gc tracked objects": lambda: len(gc.get_objects()),
        "cuda allocated / reserved MiB": lambda: (
            torch.cuda.memory_allocated() >> 20,
            torch.cuda.memory_reserved() >> 20,
        ),
    }
    state = {}
    for name, probe in probes.items():
        try:
            state[name] = repr(probe())
        except Exception as e:  # a probe this torch lacks
            state[name] = f"({type(e).__name__}: {e})"
    return state


class GcTimes:
    """Python garbage collections (count and host time per generation) of each loop, through ``gc.callbacks``."""

    def __init__(self) -> None:
        self.loop = "module"  # the loop now running; the raw blocks set "raw"
        self.counting = False
        self.found = {loop: [[0, 0.0] for _ in range(3)] for loop in ("module", "raw")}
        self.started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        elif self.counting:
            entry = self.found[self.loop][info["generation"]]
            entry[0] += 1
            entry[1] += time.perf_counter() - self.started

    def print(self, steps: int) -> None:
        print(f"\nPython gc per step (--diagnose, {steps} steps of each): collections and ms, by generation")
        for loop, generations in self.found.items():
            cells = "  ".join(
                f"gen{g} {n / steps:5.2f} x {ms * 1e3 / steps:6.3f} ms" for g, (n, ms) in enumerate(generations)
            )
            print(f"{loop:8} {cells}")


def config_kwargs(a) -> dict[str, Any]:
    import torch

    return {
        "num_layers": a.layers,
        "hidden_size": a.hidden,
        "num_attention_heads": a.heads,
        "bf16": True,
        "params_dtype": torch.bfloat16,
        "pipeline_dtype": torch.bfloat16,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "masked_softmax_fusion": False,
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "gradient_accumulation_fusion": False,
        # the objective the module trains with a token-weighted loss reduction (the step's global token-weighted
        # mean; MegatronStepRunner.prepare_model sets it): megatron then divides the gradients by the step's token
        # count in finalize_model_grads, which waits for the GPU (`if num_tokens > 0`), in both loops alike
        "calculate_per_token_loss": True,
    }


def token_dataset(a) -> Any:
    """Synthetic next-token samples (both loops read their own copy through a DataLoader of ``--mbs``)."""
    import torch
    from torch.utils.data import Dataset

    class Tokens(Dataset):
        def __len__(self):
            return 2 * a.steps * a.mbs * a.nmb

        def __getitem__(self, i):
            start = torch.randint(0, a.vocab, (1,), generator=torch.Generator().manual_seed(i))
            ids = (start + torch.arange(a.seq + 1)) % a.vocab
            return {"tokens": ids[:-1], "labels": ids[1:], "loss_mask": torch.ones(a.seq)}

    return Tokens()


def data_step(batch: dict) -> dict:
    return {k: v.cuda(non_blocking=True) for k, v in batch.items()}


def gpt_model(a, config: Any) -> Any:
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=a.vocab,
                    max_sequence_length=a.seq, pre_process=parallel_state.is_pipeline_first_stage(),
                    post_process=parallel_state.is_pipeline_last_stage())  # fmt: skip


def raw_loop(a, phases: Phases) -> Any:
    """A plain megatron-core training step on its own model (the process group is already up): ``step()``."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch.utils.data import DataLoader

    from bionemo.lightning.megatron_compat import install_multi_tensor_fix
    from bionemo.lightning.workarounds.fused_adam import fuse_adam
    from bionemo.losses import masked_token_loss_sums

    cfg = TransformerConfig(**config_kwargs(a))
    model = gpt_model(a, cfg).cuda()
    ddp = DistributedDataParallel(
        # NeMo's MegatronStrategy default: the same NaN check of the gradients every step
        cfg, DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True,
                                           check_for_nan_in_grad=True),
        Float16Module(cfg, model),
    )  # fmt: skip
    cfg.finalize_model_grads_func = finalize_model_grads
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=1e-4, optimizer="adam", bf16=True, use_distributed_optimizer=True), [ddp]
    )
    install_multi_tensor_fix()  # already installed for the module by MegatronCompatCallback; idempotent
    fuse_adam([opt])  # what MegatronCompatCallback does to the module's optimizer at train start
    position_ids = torch.arange(a.seq, device="cuda").expand(a.mbs, -1)
    batches = iter(DataLoader(token_dataset(a), batch_size=a.mbs))
    forward_backward = get_forward_backward_func()

    def forward_step(data, m):
        batch = phases.timed("data steps", lambda: data_step(next(data)))
        logits = phases.timed(  # [b, s, v]
            "model forwards", lambda: m(input_ids=batch["tokens"], position_ids=position_ids, attention_mask=None)
        )

        def loss(out):  # the same cross-entropy and megatron contract as the module's loss reduction
            loss_sum, n = masked_token_loss_sums(out.transpose(0, 1), batch["labels"], batch["loss_mask"])
            return loss_sum, n.to(torch.int), {"loss": torch.stack([loss_sum.detach(), n])}

        return logits, loss

    def step() -> None:
        ddp.zero_grad_buffer()
        opt.zero_grad()
        phases.mark("schedule")
        forward_backward(forward_step_func=forward_step, data_iterator=batches, model=[ddp],
                         num_microbatches=a.nmb, seq_length=a.seq, micro_batch_size=a.mbs,
                         forward_only=False)  # fmt: skip
        phases.mark("scheduled")
        phases.mark("optimizer")
        opt.step()
        phases.mark("stepped")

    return step


def run(a) -> tuple[list[float], list[float], Phases, Phases, list[bool]]:
    """Fit the module for ``a.steps`` steps with raw-loop blocks in between.

    Returns:
        Module step times, raw step times, each loop's :class:`Phases`, and for each module step whether NeMo's
        data sampler logged its metrics in it.
    """
    from bionemo.core.megatron_env import prepare_megatron_import

    prepare_megatron_import()
    import lightning.pytorch as pl
    import torch
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig
    from nemo import lightning as nl

    from bionemo.core import BionemoTrainableModelConfig
    from bionemo.lightning import BionemoLightningModule, MegatronDataModule, MegatronOptimizerModule
    from bionemo.losses import MaskedTokenLossReduction

    class Config(TransformerConfig, BionemoTrainableModelConfig):
        def configure_model(self, *args, **kw):
            return gpt_model(a, self)

        def get_loss_reduction_class(self):
            return MaskedTokenLossReduction

    position_ids = torch.arange(a.seq, device="cuda").expand(a.mbs, -1)

    def forward_step(model, batch):
        logits = timer.phases.timed("model forwards", lambda: model(batch["tokens"], position_ids, None))
        return logits.transpose(0, 1)  # token_logits [s, b, v]

    # module, raw; outside the callback, which NeMo deep-copies (a Profile cannot be copied)
    profiles = (cProfile.Profile(), cProfile.Profile()) if a.profile else None
    kernels = (kernel_profiler(), kernel_profiler()) if a.kernels else None
    gc_times = GcTimes()
    proxied: Counter[tuple[str, str]] = Counter()
    if a.diagnose:
        gc.callbacks.append(gc_times)
        count_attribute_fallbacks(proxied, lambda: gc_times.counting and gc_times.loop == "module")
        time_schedule_steps(lambda: timer.phases if gc_times.loop == "module" else timer.raw_phases)

    class Interleave(pl.Callback):
        """Times module steps (batch start to next batch start) and runs a raw block after every ``block``."""

        def __init__(self) -> None:
            self.steps_done = 0
            self.module_times: list[float] = []
            self.sampler_logged: list[bool] = []  # per module step: whether NeMo's sampler logged its metrics
            self.logging = a.sampler_log == "on"
            self.raw_times: list[float] = []
            self.start = 0.0
            self.raw_block = 0.0
            self.phases, self.raw_phases = (
                Phases(lambda profile=profile: profile, a.profile_phase) if profile else Phases()
                for profile in profiles or (None, None)
            )

        def _mark(self) -> None:
            torch.cuda.synchronize()
            now = time.perf_counter()
            if self.start:
                self.module_times.append(now - self.start - self.raw_block)
                self.sampler_logged.append(self.logging)
            self.phases.close(now, self.raw_block)
            self.start, self.raw_block = now, 0.0

        def on_train_start(self, trainer, pl_module):
            # after MegatronStrategy has set up the process group and megatron
            self.raw_step = raw_loop(a, self.raw_phases)
            if a.gc == "freeze":  # both loops then run over a frozen heap: old objects leave the collections
                gc.collect()
                gc.freeze()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._mark()
            self.logging = data.data_sampler.output_log
            if profiles and self.steps_done == a.warmup:
                if a.profile_phase is None:
                    profiles[0].enable()
                else:
                    self.phases.arm(True)
            if kernels and self.steps_done == a.warmup:
                kernels[0].start()
            if a.diagnose and self.steps_done == a.warmup:
                self.phases.want_state = self.raw_phases.want_state = gc_times.counting = True
                self.phases.want_graph = self.raw_phases.want_graph = True

        def on_megatron_microbatches_start(self, step):  # NeMo MegatronParallel events
            self.phases.mark("schedule")

        def on_megatron_microbatches_end(self, step, microbatch_outputs):
            self.phases.mark("scheduled")

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.phases.mark("optimizer")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.phases.mark("stepped")
            self.steps_done += 1  # not batch_idx: under MegatronStrategy it counts fetched micro-batches
            if self.steps_done % a.block:
                return
            profiled = profiles if self.steps_done == a.warmup + a.block else None
            if profiled:
                profiled[0].disable()
                self.phases.arm(False)
                self.raw_phases.arm(a.profile_phase is not None)
            torch.cuda.synchronize()
            traced = kernels if self.steps_done == a.warmup + a.block else None
            if traced:
                traced[0].stop()
                traced[1].start()
            block_start = time.perf_counter()
            gc_times.loop = "raw"
            for _ in range(a.block):
                torch.cuda.synchronize()
                start = time.perf_counter()
                self.raw_phases.close(start)
                if profiled and a.profile_phase is None:
                    profiled[1].runcall(self.raw_step)
                else:
                    self.raw_step()
                torch.cuda.synchronize()
                end = time.perf_counter()
                self.raw_times.append(end - start)
                self.raw_phases.close(end)
            self.raw_phases.arm(False)
            gc_times.loop = "module"
            if traced:
                traced[1].stop()
            self.raw_block = time.perf_counter() - block_start
            if a.sampler_log == "alternate":  # the next block of module steps with the other setting
                data.data_sampler.output_log = not data.data_sampler.output_log

        def on_train_end(self, trainer, pl_module):
            self._mark()

    timer = Interleave()

    lm = BionemoLightningModule(
        Config(**config_kwargs(a)),
        forward_step=forward_step,
        data_step=lambda it: data_step(next(it)),
        optimizer=MegatronOptimizerModule(
            config=OptimizerConfig(lr=1e-4, optimizer="adam", bf16=True, use_distributed_optimizer=True)
        ),
    )
    module_data_step = lm.data_step  # the fetch and the data step, timed like the raw loop's
    lm.data_step = lambda dataloader_iter: timer.phases.timed("data steps", lambda: module_data_step(dataloader_iter))
    data = MegatronDataModule(
        train=token_dataset(a), micro_batch_size=a.mbs, global_batch_size=a.mbs * a.nmb, seq_length=a.seq,
        log_sampler_metrics=a.sampler_log == "on",
    )  # fmt: skip
    trainer = nl.Trainer(
        devices=1, accelerator="gpu", strategy=nl.MegatronStrategy(ckpt_async_save=False),
        plugins=nl.MegatronMixedPrecision(precision="bf16-mixed"), max_steps=a.steps, limit_val_batches=0,
        num_sanity_val_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        use_distributed_sampler=False, callbacks=[timer],
    )  # fmt: skip
    trainer.fit(lm, datamodule=data)
    if profiles:
        print_profile_difference(*profiles, steps=a.block)
    if kernels:
        print_kernel_difference(*kernels, steps=a.block)
    if a.diagnose:
        print_state_difference(timer.phases.state, timer.raw_phases.state)
        gc_times.print(a.steps - a.warmup)
        print("\nattribute lookups NeMo's DDP / MegatronParallel forward to the wrapped module, per module step:")
        for (kind, item), n in proxied.most_common(12):
            print(f"{n / (a.steps - a.warmup):8.1f}  {kind}.{item}")
    return timer.module_times, timer.raw_times, timer.phases, timer.raw_phases, timer.sampler_logged


def print_profile_difference(module: cProfile.Profile, raw: cProfile.Profile, steps: int, rows: int = 40) -> None:
    """The functions whose own time the module adds over the raw loop, per step, largest first, with their callers."""
    stats = {}
    for name, profile in (("module", module), ("raw", raw)):
        profile.create_stats()
        stats[name] = profile.stats  # pyright: ignore[reportAttributeAccessIssue]
        if not stats[name]:
            print(f"--profile: the {name} loop's profile is empty")
            return
    own = {name: {key: (v[1], v[2]) for key, v in found.items()} for name, found in stats.items()}  # calls, seconds
    keys = set(own["module"]) | set(own["raw"])
    extra = sorted(keys, key=lambda k: own["raw"].get(k, (0, 0.0))[1] - own["module"].get(k, (0, 0.0))[1])
    total = sum(v[1] for v in own["module"].values()) - sum(v[1] for v in own["raw"].values())
    print(f"\nown host time the module adds under cProfile: {total * 1e3 / steps:+.2f} ms per step; largest:")
    print(f"{'extra ms/step':>13} {'module calls':>12} {'raw calls':>9}  function  <- its most frequent callers")
    for key in extra[:rows]:
        (m_calls, m_s), (r_calls, r_s) = own["module"].get(key, (0, 0.0)), own["raw"].get(key, (0, 0.0))
        chain = "".join(f"  <- {_where(c)}" for c in _caller_chain(stats["module"], key))
        print(f"{(m_s - r_s) * 1e3 / steps:+13.3f} {m_calls // steps:12d} {r_calls // steps:9d}  {_where(key)}{chain}")


def time_schedule_steps(phases: Callable[[], Phases]) -> None:
    """Add the host time of megatron's ``forward_step`` and ``backward_step`` to the running loop's ``phases()``.

    Both loops run the same no-pipelining schedule, which calls them by their module names. (A diagnostic: it
    wraps megatron's functions for the rest of this process, in both loops alike.)
    """
    from megatron.core.pipeline_parallel import schedules

    def timed(name: str) -> None:
        function = getattr(schedules, name)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            running = phases()
            if name == "backward_step" and running.want_graph:
                running.want_graph = False
                running.state |= backward_state(*args, **kwargs)
            return running.timed(f"megatron {name}", lambda: function(*args, **kwargs))

        setattr(schedules, name, wrapper)

    timed("forward_step")
    timed("backward_step")


def backward_state(
    input_tensor: Any, output_tensor: Any, output_tensor_grad: Any, model_type: Any, config: Any
) -> dict:
    """What megatron's ``backward_step`` will do: the config fields it reads and the size of the loss's graph."""
    fields = ("grad_scale_func", "deallocate_pipeline_outputs", "calculate_per_token_loss", "timers", "no_sync_func")
    state = {f"config.{field}": repr(getattr(config, field, "-"))[:60] for field in fields}
    loss = output_tensor[0] if isinstance(output_tensor, list) else output_tensor
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo.extend(next_node for next_node, _ in node.next_functions)
    kinds = Counter(type(node).__name__ for node in seen)
    state["autograd nodes of a micro-batch"] = f"{len(seen)}: " + ", ".join(
        f"{k} {n}" for k, n in sorted(kinds.items())
    )
    return state


def count_attribute_fallbacks(counts: Counter, counting: Callable[[], bool]) -> None:
    """Count, while ``counting()``, the lookups that miss NeMo's wrappers and go on to the wrapped module.

    NeMo's ``DDP.__getattr__`` answers them through ``getattr_proxy`` after an ``AttributeError``; the raw loop's
    megatron ``DistributedDataParallel`` has no such fallback. (A diagnostic: it replaces NeMo's function for the
    rest of this process.)
    """
    from nemo.lightning import megatron_parallel

    proxy = megatron_parallel.getattr_proxy

    def counted(self: Any, item: Any) -> Any:
        if counting():
            counts[(type(self).__name__, str(item))] += 1
        return proxy(self, item)

    megatron_parallel.getattr_proxy = counted


def print_state_difference(module: dict[str, str], raw: dict[str, str]) -> None:
    """Both loops' :func:`step_state` side by side, differences marked."""
    print("\nstate as a step's schedule starts (--diagnose; * = the loops differ)")
    for name in module | raw:
        m, r = module.get(name, "-"), raw.get(name, "-")
        print(f"{'*' if m != r else ' '} {name:32} module {m}" + (f"\n  {'':32} raw    {r}" if m != r else ""))


def kernel_profiler() -> Any:
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CUDA])


def print_kernel_difference(module: Any, raw: Any, steps: int, rows: int = 25) -> None:
    """GPU kernels by name: launches and GPU time per step of both loops, the largest differences first."""
    found = {}
    for name, profiler in (("module", module), ("raw", raw)):
        events = [e for e in profiler.key_averages() if e.self_device_time_total]
        found[name] = {e.key: (e.count, e.self_device_time_total / 1e3) for e in events}  # kernel -> (launches, ms)
    totals = {name: [sum(v[i] for v in kernels.values()) / steps for i in (0, 1)] for name, kernels in found.items()}
    print("\nGPU kernels per step (torch.profiler):  launches        ms")
    for name, (launches, ms) in totals.items():
        print(f"{name:38} {launches:9.0f} {ms:9.2f}")
    none = (0, 0.0)
    keys = sorted(
        set(found["module"]) | set(found["raw"]),
        key=lambda k: (
            -abs(found["module"].get(k, none)[1] - found["raw"].get(k, none)[1])
            - abs(found["module"].get(k, none)[0] - found["raw"].get(k, none)[0])
        ),
    )
    print(f"{'extra ms/step':>13} {'module launches':>15} {'raw launches':>12}  kernel")
    for key in keys[:rows]:
        (m_n, m_ms), (r_n, r_ms) = found["module"].get(key, none), found["raw"].get(key, none)
        if (m_n, round(m_ms, 3)) != (r_n, round(r_ms, 3)):
            print(f"{(m_ms - r_ms) / steps:+13.3f} {m_n / steps:15.1f} {r_n / steps:12.1f}  {key[:100]}")


def _caller_chain(stats: dict, key: tuple, depth: int = 4) -> list[tuple]:
    """The most frequent caller of ``key``, then its most frequent caller, ``depth`` levels up (no repeats)."""
    chain: list[tuple] = []
    while len(chain) < depth:
        callers = stats.get(key, (0, 0, 0.0, 0.0, {}))[4]  # caller -> (calls, primitive calls, own s, cumulative s)
        if not callers:
            break
        key = max(callers, key=lambda c: callers[c][0])
        if key in chain:
            break
        chain.append(key)
    return chain


def _where(key: tuple[str, int, str]) -> str:
    file, line, function = key
    return f"{'/'.join(file.split('/')[-3:])}:{line}({function})"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    for key, value in {**SIZES, **RUN}.items():
        parser.add_argument(f"--{key}", type=int, default=value)
    parser.add_argument("--profile", action="store_true", help="cProfile one block of each loop (see above)")
    parser.add_argument(
        "--profile-phase", type=int, choices=range(len(Phases.NAMES)), help="with --profile: only this phase (0-4)"
    )
    parser.add_argument("--kernels", action="store_true", help="GPU kernels of one block of each loop (see above)")
    parser.add_argument(
        "--diagnose", action="store_true", help="each loop's Python gc and the state its ops run in (see above)"
    )
    parser.add_argument(
        "--sampler-log",
        choices=("off", "on", "alternate"),
        default="off",
        help="NeMo's data sampler logs consumed_samples and global_batch_size every step (MegatronDataModule's "
        "log_sampler_metrics); alternate: module blocks take turns",
    )
    parser.add_argument(
        "--gc", choices=("default", "freeze"), default="default", help="freeze: gc.freeze() the heap before training"
    )
    a = parser.parse_args()
    if a.steps % a.block or a.warmup % a.block or a.warmup >= a.steps:
        parser.error("--steps and --warmup must be multiples of --block, and --warmup below --steps")
    module_times, raw_times, module_phases, raw_phases, sampler_logged = run(a)
    module_times, raw_times, sampler_logged = (
        module_times[a.warmup :],
        raw_times[a.warmup :],
        sampler_logged[a.warmup :],
    )
    tokens_per_step = a.mbs * a.nmb * a.seq
    print(
        f"{a.layers} layers x {a.hidden}, micro-batch {a.mbs} x {a.seq} tokens, {a.nmb} per step; "
        f"{len(module_times)} steps of each after {a.warmup}, alternating blocks of {a.block}"
    )
    medians = {"raw": statistics.median(raw_times), "module": statistics.median(module_times)}
    for mode, seconds in medians.items():
        print(f"{mode:8} median step {seconds * 1e3:8.2f} ms {tokens_per_step / seconds:12,.0f} tokens/s")
    pairs = [
        statistics.median(module_times[i : i + a.block]) / statistics.median(raw_times[i : i + a.block])
        for i in range(0, len(module_times), a.block)
    ]
    print(f"module / raw: {medians['module'] / medians['raw']:.3f}x (target <= 1.03)")
    print(
        f"per block pair: median {statistics.median(pairs):.3f}x, range {min(pairs):.3f}-{max(pairs):.3f}x "
        f"over {len(pairs)} pairs"
    )
    if a.sampler_log == "alternate":
        for logged in (False, True):
            seconds = statistics.median(t for t, on in zip(module_times, sampler_logged, strict=True) if on == logged)
            label = "module, NeMo's sampler logging" if logged else "module, sampler not logging"
            print(f"{label:32} median step {seconds * 1e3:8.2f} ms, {seconds / medians['raw']:.3f}x raw")
    print(f"{'phase (host time, median ms)':32} {'raw':>8} {'module':>8} {'extra':>8}")
    for i, name in enumerate(Phases.NAMES):
        raw_ms, module_ms = (
            statistics.median(step[i] for step in phases.steps[a.warmup :]) * 1e3
            for phases in (raw_phases, module_phases)
        )
        print(f"{name:32} {raw_ms:8.2f} {module_ms:8.2f} {module_ms - raw_ms:+8.2f}")
    for part in Phases.PARTS:
        raw_ms, module_ms = (
            statistics.median(parts[part] for parts in phases.step_parts[a.warmup :]) * 1e3
            for phases in (raw_phases, module_phases)
        )
        if raw_ms or module_ms:
            print(f"{'  in it: ' + part:32} {raw_ms:8.2f} {module_ms:8.2f} {module_ms - raw_ms:+8.2f}")


if __name__ == "__main__":
    main()
