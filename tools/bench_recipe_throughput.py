"""Training throughput of the built-in GPU recipe (``esm2-gpu``) per GPU, as a fraction of bf16 peak.

Trains the recipe's model exactly as ``bionemo run train --recipe esm2-gpu`` builds it (BionemoLightningModule,
MegatronStrategy, bf16, distributed Adam, the recipe's data and forward steps) on random protein sequences, all
full-length (``--lengths full``, no padding) or of UniRef-like lengths (``--lengths varied``: log-normal, median 270
residues; padded micro-batches, which the recipe's step runs on their real tokens unless
``BIONEMO_UNPADDED_TRAINING=0``), and times whole training iterations (one optimizer step over ``--nmb`` micro-
batches) after a warm-up. The reference measured in the same run is the same model with megatron-core's local
``DotProductAttention`` instead of the recipe's SDPA (flash) attention. Model FLOPs count the matmuls only (the
usual MFU convention) of the real tokens: per token and layer 8h^2 + 4h*ffn + 4*s*h forward (s: the token's sequence
length), plus 2*h*vocab for the output layer, times 3 for forward and backward; tokens/s counts real tokens. Target:
50% of the GPU's bf16 dense peak at the 650M shape. Figures: docs/benchmarks.md#training-throughput-as-a-share-of-
peak.

Batches are cut by tokens as ``bionemo run train`` cuts them on GPUs: up to ``--mbs`` x ``--nmb`` x seq_length tokens
per GPU and step (or ``--global-batch-tokens``) in micro-batches of up to ``--mbs`` x seq_length tokens, the recipe's
loader; steps then differ, so tokens/s and FLOP/s are totals over the timed steps. Full-length sequences make the
same micro-batches as ``--by-count`` (``--mbs`` sequences each, ``--nmb`` per step: ``run train --global-batch-size``).

``--devices 1,2`` also trains data-parallel on 2 GPUs (each GPU ``--mbs`` x ``--nmb`` per step) and reports per-GPU
throughput against one GPU's (the multi-GPU target: >= 95%).

Usage (GPU machine): python tools/bench_recipe_throughput.py [--mbs 32 --nmb 8 --steps 25] [--model hidden_size=1024
    --model num_attention_heads=16 ...] [--peak-tflops 989] [--num-workers 2] [--no-pin-memory] [--modes sdpa,local]
    [--lengths full|varied] [--by-count | --global-batch-tokens N] [--profile DIR]: a table of GPU time by operator
    over steps 6-7, and how much of that window the GPU was busy, its idle gaps by size and by the kernels around
    them (the profiled steps are not timed apart; use --steps 15 or more so the median is not one of them)
    [--sync-debug]: where the host waits for the GPU in steps 6-7 (each synchronizing call with its callers)
GPU smoke (CUDA only, no CPU run): python tools/bench_recipe_throughput.py --mbs 2 --nmb 2 --steps 8 --modes sdpa
    --model num_layers=2 --model hidden_size=64 --model num_attention_heads=4 --model ffn_hidden_size=128
Exits 1 if a mode failed.
"""

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

H200_BF16_DENSE_TFLOPS = 989.0
"""NVIDIA's H200 SXM figure (dense, no sparsity)."""


def _gpu_idle(prof: Any) -> str:
    """How much of the profiled window the GPU ran kernels; its longest idle gaps, with the kernel that followed."""
    import collections

    from torch.profiler import DeviceType

    events = prof.events()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type == DeviceType.CUDA)
    host = [e.time_range for e in events if e.device_type == DeviceType.CPU]
    if not kernels or not host:
        return "GPU idle: no kernels recorded"
    window_start, window_end = min(r.start for r in host), max(r.end for r in host)
    busy, gaps, reach, before = 0.0, [], window_start, "(window start)"
    by_pair: collections.Counter[str] = collections.Counter()
    for start, end, name in kernels:
        if start > reach:
            gaps.append((start - reach, reach - window_start, name))
            if start - reach >= 20:
                by_pair[f"{before[:48]}  ->  {name[:48]}"] += start - reach
        busy += max(0.0, end - max(start, reach))
        if end > reach:
            reach, before = end, name
    window = window_end - window_start
    lines = [f"GPU busy {busy / 1e3:.1f} ms of the {window / 1e3:.1f} ms window ({100 * busy / window:.1f}%); "
             f"idle gaps: {len(gaps)}, {sum(g for g, _, _ in gaps) / 1e3:.1f} ms"]  # fmt: skip
    for low, high in ((0, 20), (20, 100), (100, 1000), (1000, float("inf"))):
        sized = [g for g, _, _ in gaps if low <= g < high]
        lines.append(f"  gaps of {low}-{high} us: {len(sized)}, {sum(sized) / 1e3:.1f} ms")
    for gap, at, name in sorted(gaps, reverse=True)[:12]:
        lines.append(f"  {gap / 1e3:7.2f} ms idle at +{at / 1e3:7.1f} ms, then {name[:70]}")
    lines.append("idle gaps of 20 us or more by the kernels around them (before -> after), largest total first:")
    for pair, total in by_pair.most_common(15):
        lines.append(f"  {total / 1e3:7.2f} ms  {pair}")
    return "\n".join(lines)


def _model(args: argparse.Namespace) -> dict[str, Any]:
    import yaml

    from bionemo.esm2.recipes import GPU_MODEL

    model: dict[str, Any] = dict(GPU_MODEL)
    for item in args.model:
        key, value = item.split("=", 1)
        model[key] = yaml.safe_load(value)  # 1024 -> int, true -> bool, rope -> str
    return model


def token_budget(args: argparse.Namespace, model: dict[str, Any], devices: int) -> int | None:
    """Tokens per step (``run train``'s default on GPUs: ``--mbs`` x ``--nmb`` full-length sequences per GPU), or
    None with ``--by-count``."""
    if args.by_count:
        return None
    return args.global_batch_tokens or args.mbs * args.nmb * devices * model["seq_length"]


def sequence_lengths(args: argparse.Namespace, model: dict[str, Any], budget: int | None = None) -> list[int]:
    """Residues of the training records: all ``seq_length - 2`` (``full``), or log-normal (``varied``).

    256 records, or with a token ``budget`` enough for every step's (a pass is then the whole run).
    """
    longest = model["seq_length"] - 2
    count = 256
    if budget:
        count = max(count, int(1.3 * args.steps * budget / (longest if args.lengths == "full" else 300)))
    if args.lengths == "full":
        return [longest] * count
    import numpy as np

    rng = np.random.default_rng(0)  # bench_predict's UniRef-like lengths: median 270, sigma 0.6
    return np.clip(np.rint(rng.lognormal(np.log(270), 0.6, count)), 30, longest).astype(int).tolist()


def train_flops(model: dict[str, Any], vocab: int, tokens: int) -> float:
    """Matmul FLOPs of training one sequence of ``tokens`` (``bionemo.esm2.model.flops``, as ``run train`` counts)."""
    from bionemo.esm2.model.flops import training_flops

    return training_flops(model, vocab, [tokens])


def measure(args: argparse.Namespace) -> dict[str, float]:
    """One mode in this process: the recipe's model (``sdpa``) or the local-attention reference."""
    from bionemo.core.megatron_env import prepare_megatron_import

    prepare_megatron_import()
    import random

    import lightning.pytorch as pl
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.enums import AttnMaskType

    from bionemo.esm2.data import MaskedProteinDataset, data_step
    from bionemo.esm2.data.readers import SequenceRecord
    from bionemo.esm2.model import ESM2Config, ESM2Model
    from bionemo.esm2.model.steps import forward_step
    from bionemo.esm2.recipes import gpu
    from bionemo.esm2.recipes.inputs import datamodule
    from bionemo.esm2.recipes.model_settings import model_config
    from bionemo.esm2.recipes.token_steps import token_steps
    from bionemo.esm2.recipes.train import training_data
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning import BionemoLightningModule, MegatronOptimizerModule
    from bionemo.recipes.settings import Precision, RunSettings
    from bionemo.recipes.trainers import megatron_trainer

    model = _model(args)
    tokenizer = ProteinTokenizer()
    devices = int(args.devices)
    budget = token_budget(args, model, devices)
    rng = random.Random(0)
    residues = "ACDEFGHIKLMNPQRSTVWY"
    records = [
        SequenceRecord(f"s{i}", "".join(rng.choice(residues) for _ in range(length)))
        for i, length in enumerate(sequence_lengths(args, model, budget))
    ]
    batches: dict[str, Any] = {"global_batch_size": args.mbs * args.nmb * devices}
    if budget:
        batches = {"global_batch_tokens": budget}
    settings = RunSettings.model_validate(
        {"precision": Precision.BF16, "devices": devices, "micro_batch_size": args.mbs, **batches}
    )
    config = model_config(model, settings)
    if args.mode == "local":

        def local_model(self: ESM2Config, *_: Any, **__: Any) -> ESM2Model:
            spec = get_gpt_layer_local_spec()
            spec.submodules.self_attention.params = {"attn_mask_type": AttnMaskType.padding}
            return ESM2Model(self, transformer_layer_spec=spec)

        config.configure_model = local_model.__get__(config)  # type: ignore[method-assign]
    module = BionemoLightningModule(
        config,
        forward_step=forward_step,
        data_step=data_step,
        optimizer=MegatronOptimizerModule(
            config=OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True, use_distributed_optimizer=True)
        ),
    )
    if budget:  # the recipe's token batches and loader, as `run train` cuts them on GPUs
        lengths = [len(r.sequence) + 2 for r in records]
        steps = token_steps(settings, model["seq_length"], {"training": lengths})
        assert steps is not None
        defaults = replace(gpu().defaults, model=model)
        data = training_data(settings, defaults, records, records[: steps.parts], args.steps, steps)
        cut = data.datasets["train"].batches
        step_lengths = [[lengths[i] for i in cut.global_batch(step)] for step in range(args.steps)]
    else:
        samples = args.steps * args.mbs * args.nmb * devices
        train = MaskedProteinDataset(records, tokenizer, length=samples)
        loader = {"num_workers": args.num_workers, "pin_memory": args.pin_memory}
        data = datamodule(settings, gpu().defaults, loader=loader, train=train)
        step_lengths = []

    class Timer(pl.Callback):
        def __init__(self) -> None:
            self.starts: list[float] = []

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            torch.cuda.synchronize()
            self.starts.append(time.perf_counter())
            step = len(self.starts) - 1  # batch_idx is not the step under MegatronStrategy
            if args.profile and step in (6, 8):  # two warm steps: where the GPU's time goes
                self._profile(start=step == 6)
            if args.sync_debug and step in (6, 8):
                self._sync_debug(start=step == 6)

        def _sync_debug(self, start: bool) -> None:
            """Where the host waits for the GPU in two warm steps (torch's sync debug mode, with the callers)."""
            import collections
            import traceback
            import warnings

            if start:
                self.syncs: collections.Counter[str] = collections.Counter()

                def show(message: Any, category: Any, *_: Any, **__: Any) -> None:
                    if "synchronizing" in str(message):
                        frames = traceback.extract_stack()[-6:-2][::-1]  # the waiting call, then its callers
                        self.syncs["  <- ".join(f"{Path(f.filename).name}:{f.lineno}({f.name})" for f in frames)] += 1

                self.warnings = warnings.catch_warnings()
                self.warnings.__enter__()
                warnings.simplefilter("always")
                warnings.showwarning = show
                torch.cuda.set_sync_debug_mode("warn")
                return
            torch.cuda.set_sync_debug_mode("default")
            self.warnings.__exit__(None, None, None)
            print(f"SYNC host waits for the GPU in steps 6-7 ({sum(self.syncs.values())}), by caller:", flush=True)
            for where, count in self.syncs.most_common(15):
                print(f"SYNC {count:5d}  {where}", flush=True)

        def _profile(self, start: bool) -> None:
            from torch.profiler import ProfilerActivity, profile

            if start:
                self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                self.prof.__enter__()
                return
            self.prof.__exit__(None, None, None)
            table = self.prof.key_averages().table(
                sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=70
            )
            Path(args.profile).mkdir(parents=True, exist_ok=True)
            idle = _gpu_idle(self.prof)
            (Path(args.profile) / f"recipe_{args.mode}_gpu_ops.txt").write_text(table + "\n" + idle)
            print(idle, flush=True)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            torch.cuda.synchronize()
            self.starts.append(time.perf_counter())

    timer = Timer()
    # the recipe's strategy and precision plugin; build_trainer would add checkpoints, validation and a progress bar
    trainer = megatron_trainer(
        settings,
        training=True,
        precision=Precision.BF16.value,
        common={
            "devices": devices,
            "max_steps": args.steps,
            "limit_val_batches": 0,
            "num_sanity_val_steps": 0,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "callbacks": [timer],
        },
    )
    trainer.fit(module, datamodule=data)
    periods = sorted(b - a for a, b in zip(timer.starts[5:], timer.starts[6:], strict=False))
    result = {
        "rank": trainer.global_rank,
        "median_step_s": periods[len(periods) // 2],
        "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "padded_vocab": config.padded_vocab_size,
    }
    if step_lengths:  # steps differ: totals over the timed steps (5 on), per GPU
        timed = step_lengths[5 : len(timer.starts) - 1]
        seconds = timer.starts[-1] - timer.starts[5]
        result["tokens_per_s"] = sum(map(sum, timed)) / seconds / devices
        flops = sum(train_flops(model, config.padded_vocab_size, k) for step in timed for k in step)
        result["tflops"] = flops / seconds / devices / 1e12
        result["sequences_per_step"] = sum(map(len, timed)) / len(timed)
    return result


def gemm_tflops() -> float:
    """What one large bf16 matmul reaches on this GPU: the practical ceiling, for context."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        _ = a @ b
    torch.cuda.synchronize()
    start, n = time.perf_counter(), 20
    for _ in range(n):
        _ = a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * n / (time.perf_counter() - start) / 1e12


def main() -> None:
    from bionemo.esm2.recipes.train import TRAIN_WORKERS

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mbs", type=int, default=32, help="micro-batch size (recipe: 32)")
    parser.add_argument("--nmb", type=int, default=8, help="micro-batches per step (recipe: 256 / 32 = 8)")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument(
        "--devices",
        default="1",
        help="comma-separated GPU counts, data-parallel (each GPU: --mbs x --nmb per step); per-GPU figures against "
        "the first count's",
    )
    parser.add_argument("--model", action="append", default=[], help="KEY=VALUE override of the recipe's model")
    workers = f"DataLoader workers (the recipe on GPUs: {TRAIN_WORKERS})"
    parser.add_argument("--num-workers", type=int, default=TRAIN_WORKERS, help=workers)
    parser.add_argument(
        "--pin-memory", action=argparse.BooleanOptionalAction, default=True, help="page-locked batches (the recipe: on)"
    )
    parser.add_argument(
        "--lengths",
        choices=["full", "varied"],
        default="full",
        help="full: every sequence seq_length - 2 residues (no padding); varied: UniRef-like, padded batches "
        "(run unpadded)",
    )
    parser.add_argument(
        "--global-batch-tokens",
        type=int,
        help="tokens per step over all GPUs (default: --mbs x --nmb x seq_length per GPU, as `run train` on GPUs)",
    )
    parser.add_argument(
        "--by-count",
        action="store_true",
        help="batches of --mbs sequences, --nmb per step (`run train --global-batch-size`); by default batches are "
        "cut by tokens as `run train` cuts them on GPUs (micro-batches of up to --mbs x seq_length tokens, the "
        "recipe's loader: --num-workers and --pin-memory unused)",
    )
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS)
    parser.add_argument("--profile", metavar="DIR", help="write the GPU time by operator of steps 6-7 into DIR")
    parser.add_argument("--sync-debug", action="store_true", help="print where steps 6-7 wait for the GPU")
    parser.add_argument("--modes", default="sdpa,local", help="comma-separated: sdpa (the recipe), local")
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        result = measure(args)
        if result["rank"] == 0:
            print("RESULT " + json.dumps(result), flush=True)
        return
    model = _model(args)
    counts = [int(n) for n in args.devices.split(",")]
    runs = [(mode, n) for n in counts for mode in args.modes.split(",")]

    def label(mode: str, n: int) -> str:
        return mode if len(counts) == 1 else f"{mode} x{n}"

    results = {}
    for mode, n in runs:
        # Lightning starts the other ranks by running this same command line again (its subprocess launcher)
        command = [sys.executable, __file__, *sys.argv[1:], "--mode", mode, "--devices", str(n)]
        out = subprocess.run(command, capture_output=True, text=True)
        name = label(mode, n)
        for x in out.stdout.splitlines():
            if x.startswith("SYNC "):
                print(f"{name}: {x[len('SYNC ') :]}")
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{name}: failed\n{out.stderr[-3000:]}")
            continue
        results[mode, n] = json.loads(line[len("RESULT ") :])
    batches = (
        f"micro-batch {args.mbs} x {args.nmb} per step; loader workers {args.num_workers}, pinned {args.pin_memory}"
    )
    if token_budget(args, model, 1):
        batches = (
            f"up to {token_budget(args, model, counts[0]):,} tokens per step on {counts[0]} GPU(s) in micro-batches "
            f"of up to {args.mbs} x {model['seq_length']} tokens (the recipe's loader)"
        )
    print(f"model {json.dumps(model)}; {batches}; sequence lengths {args.lengths}")
    ceiling = gemm_tflops()
    peak = args.peak_tflops
    print(f"8192^3 bf16 matmul: {ceiling:.0f} TFLOP/s ({ceiling / peak:.0%} of the {peak:.0f} TFLOP/s peak)")
    lengths = [n + 2 for n in sequence_lengths(args, model)]  # records are taken in turn: a step's mean
    samples = args.mbs * args.nmb  # per GPU and step
    tokens = samples * sum(lengths) / len(lengths)
    per_gpu = " per GPU" if counts != [1] else ""
    for (mode, n), r in results.items():
        step_flops = samples * sum(train_flops(model, r["padded_vocab"], k) for k in lengths) / len(lengths)
        flops = r.get("tflops", step_flops / r["median_step_s"] / 1e12)
        rate = r.get("tokens_per_s", tokens / r["median_step_s"])
        name = label(mode, n)
        scaling = ""
        if (mode, counts[0]) in results and n != counts[0]:
            first = results[mode, counts[0]]
            scaling = f", {rate / first.get('tokens_per_s', tokens / first['median_step_s']):.1%} of {counts[0]} GPU's"
        per_step = f" ({r['sequences_per_step']:.0f} sequences)" if "sequences_per_step" in r else ""
        print(
            f"{name:8} {r['median_step_s'] * 1e3:8.1f} ms/step{per_step} {rate:12,.0f} tokens/s{per_gpu} "
            f"{flops:6.1f} TFLOP/s = {flops / args.peak_tflops:5.1%} of peak (target >= 50%), "
            f"{r['max_memory_gib']:.1f} GiB{scaling}"
        )
    for n in counts:
        if {("sdpa", n), ("local", n)} <= results.keys():
            speedup = results["local", n]["median_step_s"] / results["sdpa", n]["median_step_s"]
            print(f"sdpa speed-up over local attention ({n} GPU): {speedup:.2f}x")
    failed = [label(mode, n) for mode, n in runs if (mode, n) not in results]
    if failed:
        raise SystemExit(f"failed runs: {', '.join(failed)}")


if __name__ == "__main__":
    main()
