"""Prediction throughput of ``bionemo run predict`` against Hugging Face transformers, on identical weights.

Per ESM-2 shape: a random ``EsmForMaskedLM`` (seeded, nothing downloaded) saved as a Hugging Face folder, and a
FASTA (log-normal lengths, median 270, 30-1022 residues, uniform over the 20 amino acids) embedded by

* transformers ``EsmModel`` (bf16, SDPA, ``inference_mode``) in this process: per batch the forward, the mean of
  ``last_hidden_state`` over residues (no ``<cls>``, ``<eos>``, padding) and its copy to the CPU; batches in
  input order (32) and length-sorted (fixed sizes; budgets on the padded b x max_len). Tokenized before timing;
  one untimed warm-up batch per option. The best option is the reference.
* ``bionemo run predict --checkpoint HF_DIR --include embeddings`` (the same workload; the default adds a
  perplexity pass) as a subprocess per device count: ``summary.json``'s ``tokens_per_second`` (prediction loop
  only, its first batch included: data workers starting, first kernel launches, Triton compiling its kernels on a
  machine with an empty cache), else the wall time (the table says which). Also printed: the ratio after our first
  batch (``tokens_per_second_after_first_batch``), like for like with HF's figure, which leaves out its warm-up,
  and the 1-device run's wall time by phase (``summary.json``'s ``phase_seconds``, the loop, and the rest: the
  interpreter, imports and exit).
  ``--warm-up`` first runs ours once untimed on 32 sequences (Triton's kernel cache and the bytecode then warm, as
  after any earlier run on the machine; on a fresh machine the first run compiles them).

Ours runs with ``run predict``'s default batching unless ``--tokens-per-batch`` is given. Tokens = sum of
(length + 2). Targets: ours on 1 GPU >= 3x HF's best in the loop and >= 2x counting the whole command's wall time;
2 GPUs >= 1.9x 1 GPU; start-up (first 32 sequences, 1 device, command to exit) <= 8 s. Without CUDA, HF runs on
the CPU in float32 (bf16 SDPA is slow there): a smoke run, not a measurement.

Usage (GPU machine): python tools/bench_predict.py [--shapes 150m,650m --sequences 20000 --devices 1,2
    --tokens-per-batch 131072 --hf-batch-sizes 32,64,128 --hf-token-budgets 32768,65536 --out DIR --skip-hf
    --warm-up --hf-no-input-order]
CPU smoke: uv run python tools/bench_predict.py --shapes demo --sequences 40 --hf-batch-sizes 8
    --hf-token-budgets 4096 --tokens-per-batch 4096
Exits 1 if a ``run predict`` failed. Figures: docs/benchmarks.md#prediction-throughput-against-transformers.
"""

import argparse
import gc
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bionemo.esm2.catalog import DEMO_SHAPE, ESM2_SHAPES, ModelShape
from bionemo.esm2.tokenizer import AMINO_ACIDS, ProteinTokenizer

TOKENIZER = ProteinTokenizer()
HF_SETTINGS: dict[str, Any] = {
    "vocab_size": 33, "max_position_embeddings": 1026, "position_embedding_type": "rotary", "token_dropout": True,
    "mask_token_id": 32, "pad_token_id": 1, "emb_layer_norm_before": False, "layer_norm_eps": 1e-5,
    "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
}  # fmt: skip
"""``EsmConfig`` settings of tests/support/hf_esm.py's ``random_hf_esm``, with ESM-2's LayerNorm epsilon."""


def model_shape(key: str) -> ModelShape:
    if key == "demo":
        return DEMO_SHAPE
    if f"esm2-{key}" not in ESM2_SHAPES:
        valid = ", ".join(["demo", *(name.removeprefix("esm2-") for name in ESM2_SHAPES)])
        raise SystemExit(f"--shapes: unknown shape {key!r}; valid: {valid}")
    return ESM2_SHAPES[f"esm2-{key}"]


def random_proteins(count: int, seed: int) -> list[str]:
    """Log-normal lengths (median 270, sigma 0.6) clipped to 30-1022, residues uniform over 20 amino acids."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(math.log(270), 0.6, count)), 30, 1022).astype(np.int64)
    letters = np.frombuffer(AMINO_ACIDS.encode(), dtype=np.uint8)
    text = letters[rng.integers(0, len(AMINO_ACIDS), int(lengths.sum()))].tobytes().decode()
    ends = np.cumsum(lengths).tolist()
    return [text[end - n : end] for end, n in zip(ends, lengths.tolist(), strict=True)]


def write_fasta(path: Path, sequences: list[str]) -> Path:
    path.write_text("".join(f">seq{i}\n{s}\n" for i, s in enumerate(sequences)))
    return path


def save_random_hf(folder: Path, shape: ModelShape, seed: int) -> None:
    """A random ``EsmForMaskedLM`` of ``shape`` with the test suite's settings (tests/support/hf_esm.py)."""
    from transformers import EsmConfig, EsmForMaskedLM

    config = EsmConfig(
        **HF_SETTINGS,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_attention_heads,
        intermediate_size=shape.ffn_hidden_size,
    )
    torch.manual_seed(seed)
    EsmForMaskedLM(config).save_pretrained(folder, safe_serialization=True)


def hf_plans(
    lengths: list[int], batch_sizes: list[int], budgets: list[int], input_order: bool = True
) -> dict[str, list[list[int]]]:
    """Batches of sequence indices per batching option (length-sorted ones longest first)."""
    chunk = lambda order, size: [order[i : i + size] for i in range(0, len(order), size)]  # noqa: E731
    by_length = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    plans = {"input order, batch 32": chunk(list(range(len(lengths))), 32)} if input_order else {}
    plans |= {f"sorted, batch {size}": chunk(by_length, size) for size in batch_sizes}
    for budget in budgets:
        batches: list[list[int]] = []
        for i in by_length:  # longest first: a batch's first sequence sets its padded length
            if batches and (len(batches[-1]) + 1) * (lengths[batches[-1][0]] + 2) <= budget:
                batches[-1].append(i)
            else:
                batches.append([i])
        plans[f"sorted, <= {budget} padded tokens"] = batches
    return plans


def hf_batch(model: Any, encoded: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Mean last hidden state over residues, ``[b, h]`` float32 on the CPU."""
    ids = torch.nn.utils.rnn.pad_sequence(encoded, batch_first=True, padding_value=TOKENIZER.pad_id).to(device)
    attention = ids != TOKENIZER.pad_id
    hidden = model(input_ids=ids, attention_mask=attention).last_hidden_state
    residues = (attention & (ids != TOKENIZER.cls_id) & (ids != TOKENIZER.eos_id)).unsqueeze(-1)
    return ((hidden.float() * residues).sum(1) / residues.sum(1)).cpu()


def hf_seconds(model: Any, encoded: list[torch.Tensor], batches: list[list[int]], device: torch.device) -> float:
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    with torch.inference_mode():
        hf_batch(model, [encoded[i] for i in batches[0]], device)  # warm-up, not timed
        synchronize()
        start = time.perf_counter()
        for batch in batches:
            hf_batch(model, [encoded[i] for i in batch], device)
        synchronize()
    return time.perf_counter() - start


def bench_hf(folder: Path, sequences: list[str], args: argparse.Namespace, tokens: int) -> tuple[dict, torch.Tensor]:
    """Tokens/s per batching option (``"OOM"`` where CUDA ran out of memory); the first 32 embeddings."""
    from transformers import EsmModel
    from transformers.utils import logging

    logging.set_verbosity_error()  # the LM head's weights are unused by EsmModel; no need to say so
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = EsmModel.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa", add_pooling_layer=False)
    model = model.eval().to(device)  # pyright: ignore[reportArgumentType]
    encoded = [TOKENIZER.encode(s) for s in sequences]
    plans = hf_plans(
        [len(s) for s in sequences], args.hf_batch_sizes, args.hf_token_budgets, not args.hf_no_input_order
    )
    results: dict[str, float | str] = {}
    for name, batches in plans.items():
        try:
            results[name] = tokens / hf_seconds(model, encoded, batches, device)
        except torch.OutOfMemoryError:
            results[name] = "OOM"
        gc.collect()
        torch.cuda.empty_cache()  # a no-op without CUDA
    with torch.inference_mode():
        reference = hf_batch(model, encoded[:32], device)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return results, reference


def batch_flags(tokens_per_batch: int | None) -> list[str]:
    """``--tokens-per-batch N`` if given and ``run predict`` has it (else ``--micro-batch-size 32``); default none."""
    if tokens_per_batch is None:
        return []
    cmd = [sys.executable, "-m", "bionemo.cli", "run", "predict", "--help"]
    wide = {**os.environ, "COLUMNS": "250"}  # rich cuts long option names in a narrow terminal
    help_text = subprocess.run(cmd, capture_output=True, text=True, env=wide).stdout
    if "--tokens-per-batch" in help_text:
        return ["--tokens-per-batch", str(tokens_per_batch)]
    return ["--micro-batch-size", "32"]


SUMMARY_PHASES = ("inputs", "trainer_environment", "model_setup", "loop", "write")
"""The phases a ``run predict``'s ``summary.json`` times (``phase_seconds``, and ``predict_seconds`` for the loop)."""


def summary_phases(summary: dict[str, Any]) -> dict[str, float | None]:
    """:data:`SUMMARY_PHASES`' seconds from a ``summary.json`` (None where it timed none)."""
    phases = {**summary.get("phase_seconds", {}), "loop": summary.get("predict_seconds")}
    return {name: phases.get(name) for name in SUMMARY_PHASES}


def run_ours(folder: Path, fasta: Path, out: Path, devices: int, flags: list[str], tokens: int) -> dict[str, Any]:
    """One ``bionemo run predict`` subprocess: wall seconds, tokens/s and where that figure comes from."""
    cmd = [sys.executable, "-m", "bionemo.cli", "run", "predict", "--checkpoint", str(folder), "--data", str(fasta)]
    cmd += ["--output-dir", str(out), "--devices", str(devices), "--include", "embeddings", *flags]
    log = out.with_suffix(".log")
    shutil.rmtree(out, ignore_errors=True)  # run predict resumes from a previous run's shards
    start = time.perf_counter()
    with log.open("w") as handle:
        code = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    if code != 0:
        return {"wall_s": wall, "tokens_per_s": None, "source": f"FAILED (exit {code}, see {log})"}
    summary = json.loads((out / "summary.json").read_text())
    if "tokens_per_second" not in summary:
        return {"wall_s": wall, "tokens_per_s": tokens / wall, "source": "WALL TIME (no tokens_per_second in summary)"}
    source = "predict loop" if summary.get("tokens") == tokens else f"predict loop, but {summary.get('tokens')} tokens"
    return {"wall_s": wall, "tokens_per_s": summary["tokens_per_second"], "source": source, "summary": summary}


def bench_shape(key: str, sequences: list[str], fasta: Path, args: argparse.Namespace) -> dict[str, Any]:
    tokens = sum(len(s) + 2 for s in sequences)
    folder = args.out / f"hf-{key}"
    save_random_hf(folder, model_shape(key), args.seed)
    hf, reference = ({}, None) if args.skip_hf else bench_hf(folder, sequences, args, tokens)
    flags = batch_flags(args.tokens_per_batch) + args.ours_flags
    result: dict[str, Any] = {"hf": hf, "ours": {}, "ours_batch_flags": flags, "warm_up_run": args.warm_up}
    first = write_fasta(args.out / "first32.fasta", sequences[:32])
    first_tokens = sum(len(s) + 2 for s in sequences[:32])
    if args.warm_up:  # untimed: fills Triton's kernel cache and the bytecode, as any earlier run on the machine would
        run_ours(folder, first, args.out / f"warm-up-{key}", 1, flags, first_tokens)
    for devices in args.devices:
        result["ours"][devices] = run_ours(folder, fasta, args.out / f"ours-{key}-{devices}", devices, flags, tokens)
    result["max_abs_diff_first_32"] = max_difference(reference, args.out / f"ours-{key}-{args.devices[0]}")
    start_up = run_ours(folder, first, args.out / f"startup-{key}", 1, flags, first_tokens)
    result["startup_wall_s"] = start_up["wall_s"] if start_up["tokens_per_s"] is not None else None
    measured = {name: value for name, value in result["hf"].items() if isinstance(value, float)}
    best = max(measured, key=measured.__getitem__) if measured else None
    result["hf_best"] = {"batching": best, "tokens_per_s": measured[best]} if best else None
    speed = {k: v["tokens_per_s"] for k, v in result["ours"].items()}
    result["ratio_ours_1_over_hf_best"] = speed[1] / measured[best] if best and speed.get(1) else None
    wall = result["ours"].get(1, {}).get("wall_s")
    result["ratio_ours_1_command_over_hf_best"] = tokens / wall / measured[best] if best and wall else None
    result["ratio_2_over_1"] = speed[2] / speed[1] if speed.get(1) and speed.get(2) else None
    steady = result["ours"].get(1, {}).get("summary", {}).get("tokens_per_second_after_first_batch")
    result["ratio_ours_1_after_first_batch_over_hf_best"] = steady / measured[best] if best and steady else None
    return result


def max_difference(reference: torch.Tensor | None, out: Path) -> float | None:
    """Largest difference between our first embeddings and HF's (``None`` without either)."""
    from safetensors.torch import load_file

    path = out / "predictions.safetensors"
    if reference is None or not path.exists():
        return None
    return float((load_file(path)["embeddings"][: len(reference)].float() - reference).abs().max())


def _ratio(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def print_shape(key: str, result: dict[str, Any], tokens: int, device: str) -> None:
    shape = model_shape(key)
    print(f"\nesm2-{key} ({shape.num_layers} layers x {shape.hidden_size}); {tokens:,} tokens; HF on {device}")
    print(f"  {'method':44} {'tokens/s':>12} {'wall s':>8}  note")
    for name, value in result["hf"].items():
        figure = f"{value:12,.0f}" if isinstance(value, float) else f"{value:>12}"
        print(f"  {'HF ' + name:44} {figure} {'':>8}")
    best = result["hf_best"]
    if best:
        print(f"  {'HF best: ' + best['batching']:44} {best['tokens_per_s']:12,.0f}")
    for devices, ours in result["ours"].items():
        figure = f"{ours['tokens_per_s']:12,.0f}" if ours["tokens_per_s"] else f"{'-':>12}"
        print(f"  {f'ours, {devices} device(s)':44} {figure} {ours['wall_s']:8.1f}  {ours['source']}")
    summary = result["ours"].get(1, {}).get("summary")
    if summary and summary.get("phase_seconds"):
        phases = summary_phases(summary)
        rest = result["ours"][1]["wall_s"] - sum(value or 0.0 for value in phases.values())
        split = ", ".join(f"{name} {_ratio(value)}" for name, value in phases.items())
        print(f"  {'ours, 1 device: wall seconds by phase':44} {split}, rest (interpreter, imports, exit) {rest:.2f}")
    for name, value in [
        ("ours batching", " ".join(result["ours_batch_flags"])),
        ("ours after an untimed warm-up run (--warm-up)", "yes" if result.get("warm_up_run") else "no: cold caches"),
        ("max |ours - HF|, first 32 embeddings", _ratio(result["max_abs_diff_first_32"], ".1e")),
        ("ratio ours (1 device) / HF best (target >= 3.0)", _ratio(result["ratio_ours_1_over_hf_best"])),
        (
            "  counting our whole command's wall time (target >= 2.0)",
            _ratio(result.get("ratio_ours_1_command_over_hf_best")),
        ),
        (
            "  the same after our first batch (HF: after its warm-up)",
            _ratio(result.get("ratio_ours_1_after_first_batch_over_hf_best")),
        ),
        ("ratio ours 2 devices / 1 device (target >= 1.9)", _ratio(result["ratio_2_over_1"])),
        ("start-up s, first 32 sequences, 1 device (target <= 8)", _ratio(result["startup_wall_s"])),
    ]:
        print(f"  {name:57} {value}")


def parse_args() -> argparse.Namespace:
    ints = lambda text: [int(item) for item in text.split(",") if item]  # noqa: E731
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shapes", type=lambda text: text.split(","), default=["150m", "650m"])
    parser.add_argument("--sequences", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", type=ints, default=[1], help="device counts for ours, e.g. 1,2")
    parser.add_argument(
        "--tokens-per-batch", type=int, default=None, help="ours with this budget (default: run predict's defaults)"
    )
    parser.add_argument("--hf-batch-sizes", type=ints, default=[32, 64, 128])
    parser.add_argument("--hf-token-budgets", type=ints, default=[32768, 65536])
    parser.add_argument("--out", type=Path, default=None, help="logs, FASTA, models (default: a new temp dir)")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument(
        "--warm-up",
        action="store_true",
        help="run ours once, untimed, on 32 sequences first (warm Triton and bytecode caches, as after any run)",
    )
    parser.add_argument(
        "--hf-no-input-order", action="store_true", help="leave out HF's input-order batches (never its best; slow)"
    )
    parser.add_argument(
        "--ours-flags", type=shlex.split, default=[], help="more `run predict` flags, e.g. --ours-flags=--unpadded"
    )
    args = parser.parse_args()
    for key in args.shapes:
        model_shape(key)  # an unknown shape stops here, before any work
    args.out = args.out or Path(tempfile.mkdtemp(prefix="bench_predict_"))
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def main() -> None:
    args = parse_args()
    sequences = random_proteins(args.sequences, args.seed)
    fasta = write_fasta(args.out / "proteins.fasta", sequences)
    tokens = sum(len(s) + 2 for s in sequences)
    device = torch.cuda.get_device_name() + " bf16" if torch.cuda.is_available() else "CPU float32 (smoke run)"
    print(f"{len(sequences)} sequences, median length {int(np.median([len(s) for s in sequences]))}; out: {args.out}")
    results: dict[str, Any] = {}
    for key in args.shapes:
        results[key] = bench_shape(key, sequences, fasta, args)
        print_shape(key, results[key], tokens, device)
        report = {"sequences": len(sequences), "tokens": tokens, "hf_device": device, "shapes": results}
        (args.out / "bench_predict.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\nfigures: {args.out / 'bench_predict.json'}")
    failed = [
        f"{key}, {n} device(s)"
        for key, r in results.items()
        for n, run in r["ours"].items()
        if run["tokens_per_s"] is None
    ]
    if failed:
        raise SystemExit(f"bionemo run predict failed: {'; '.join(failed)} (logs under {args.out})")


if __name__ == "__main__":
    main()
