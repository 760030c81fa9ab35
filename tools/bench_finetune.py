"""Fine-tuning throughput and peak memory of ``bionemo run finetune`` against transformers + peft, same weights.

Per ESM-2 shape: a random ``EsmForMaskedLM`` (seeded, nothing downloaded) saved as a Hugging Face folder, and random
proteins (tools/bench_predict.py's log-normal lengths, median 270, 30-1022 residues) with two random classes.

* transformers + peft in this process: ``EsmForSequenceClassification.from_pretrained(HF_DIR)`` (SDPA), bf16
  autocast, fused AdamW (lr 1e-4), batches of ``--batch`` sequences in random order padded to the longest; full
  fine-tuning, and LoRA r=8 / alpha 16 on ``query``, ``key``, ``value``, ``dense`` (peft). Tokenized before timing;
  ``--warm-up`` untimed steps first. Peak memory: ``torch.cuda.max_memory_allocated``.
* ``bionemo run finetune --checkpoint HF_DIR --head hf --encoder full|lora`` (the CLI defaults otherwise: bf16,
  on GPUs batches cut by tokens, 16,384 per step, unpadded; ``--ours-flags`` adds flags) as a subprocess:
  ``summary.json``'s ``train_tokens_per_second`` (steps after the first three, validation excluded) and
  ``peak_memory_gib``.
* ``--predict``: each fine-tuned model of ours then runs ``bionemo run predict --checkpoint RUN/model.safetensors``
  on the validation CSV (wall time and rows), and ``bionemo convert to-hf`` exports it (LoRA merged) to an
  ``EsmForSequenceClassification`` folder, which transformers scores on the same sequences in float32 (SDPA):
  the largest difference of the class probabilities, ours against transformers' (ours runs at the CLI's
  precision: bf16 on GPUs).
* ``--frozen``: ``--encoder frozen`` over its default 10 passes: its one-time encoding (``encode_seconds``) and head
  training against the same encoding repeated every pass (10 x ``encode_seconds`` + the same head training).

Tokens = sum of (length + 2) of the sequences trained on. Targets: ours >= 5x transformers + peft tokens/s, full and
LoRA; LoRA's peak memory <= half of full fine-tuning's; frozen >= 5x faster than re-encoding every pass.
Without CUDA everything runs on the CPU in float32: a smoke run, not a measurement.

Usage (GPU machine): python tools/bench_finetune.py [--shapes 650m,150m --sequences 2000 --steps 30 --batch 16
    --modes full,lora --frozen --predict --out DIR --skip-hf --ours-flags=...]
CPU smoke: uv run python tools/bench_finetune.py --shapes demo --sequences 24 --steps 2 --batch 8 --modes lora --frozen
    --predict
Figures: docs/benchmarks.md#fine-tuning.
"""

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_predict import model_shape, random_proteins, save_random_hf  # noqa: E402
from bionemo.esm2.tokenizer import ProteinTokenizer  # noqa: E402

TOKENIZER = ProteinTokenizer()
LORA_TARGETS = ["query", "key", "value", "dense"]


def write_csv(path: Path, sequences: list[str], seed: int) -> Path:
    """``id,sequence,label`` with labels drawn at random from two classes."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (len(sequences),), generator=generator).tolist()
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "sequence", "label"])
        writer.writerows([f"p{i}", s, "ab"[y]] for i, (s, y) in enumerate(zip(sequences, labels, strict=True)))
    return path


def padded(encoded: list[torch.Tensor]) -> torch.Tensor:
    """Token ids ``[len(encoded), longest]``, padded on the right with the tokenizer's pad id."""
    ids = torch.full((len(encoded), max(len(e) for e in encoded)), TOKENIZER.pad_id, dtype=torch.long)
    for row, e in enumerate(encoded):
        ids[row, : len(e)] = e
    return ids


def bench_hf(folder: Path, sequences: list[str], mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """transformers (+ peft for ``lora``) training steps: tokens/s and peak memory."""
    from transformers import EsmForSequenceClassification

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    model: Any = EsmForSequenceClassification.from_pretrained(folder, num_labels=2, attn_implementation="sdpa")
    model = model.to(device)
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model, LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, task_type="SEQ_CLS", lora_dropout=0.0)
        )
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=cuda)
    generator = torch.Generator().manual_seed(0)
    encoded = [TOKENIZER.encode(s) for s in sequences]
    labels = torch.randint(0, 2, (len(sequences),), generator=generator)
    order = torch.randperm(len(sequences), generator=generator).tolist()
    steps = args.warm_up + args.steps
    batches = [order[(k * args.batch) % len(order) :][: args.batch] for k in range(steps)]
    batches = [b if len(b) == args.batch else order[: args.batch] for b in batches]
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    tokens, started = 0, 0.0
    for k, batch in enumerate(batches):
        if k == args.warm_up:
            if cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
        ids = padded([encoded[i] for i in batch]).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            out = model(input_ids=ids, attention_mask=ids != TOKENIZER.pad_id, labels=labels[batch].to(device))
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if k >= args.warm_up:
            tokens += sum(len(encoded[i]) for i in batch)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    del model, optimizer
    if cuda:
        torch.cuda.empty_cache()
    return {"tokens_per_second": tokens / seconds, "peak_memory_gib": peak, "seconds": seconds}


def run_ours(folder: Path, train: Path, val: Path, out: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """``bionemo run finetune`` as a subprocess; its summary.json and the command's wall time."""
    command = [
        sys.executable, "-m", "bionemo.cli", "run", "finetune", "--checkpoint", str(folder), "--data", str(train),
        "--val-data", str(val), "--task", "classification", "--label-column", "label", "--head", "hf",
        "--encoder", mode, "--output-dir", str(out), *args.ours_flags,
    ]  # fmt: skip
    if mode == "frozen":
        pass  # the default run length: 10 passes
    else:
        command += ["--max-steps", str(args.steps + 3), "--val-check-interval", str(args.steps + 3)]
    if mode == "lora":
        command += ["--lora-rank", "8", "--lora-alpha", "16"]
    summary, wall = finetune_subprocess(command, out, f"bionemo run finetune --encoder {mode}")
    return {**summary, "wall_seconds": wall}


def predict_and_export(run: Path, val: Path) -> dict[str, Any]:
    """``run``'s model predicts ``val`` and is exported to transformers: wall time, rows and the probabilities' gap.

    Exits (``SystemExit``) when a command fails or the predictions are not one row per sequence in input order.
    """
    from safetensors import safe_open
    from transformers import EsmForSequenceClassification

    from bionemo.recipes.outputs import read_predictions

    cli = [sys.executable, "-m", "bionemo.cli"]
    started = time.perf_counter()
    _checked(
        [*cli, "run", "predict", "--checkpoint", str(run / "model.safetensors"), "--data", str(val),
         "--output-dir", str(run / "predict")], "bionemo run predict",
    )  # fmt: skip
    wall = time.perf_counter() - started
    _checked([*cli, "convert", "to-hf", str(run / "model.safetensors"), str(run / "hf")], "bionemo convert to-hf")
    with val.open(newline="") as f:
        rows = list(csv.DictReader(f))
    ids, tensors = read_predictions(run / "predict" / "predictions.safetensors")
    if ids != [row["id"] for row in rows]:
        raise SystemExit(f"run predict: ids {ids[:3]}... are not the validation CSV's, in its order")
    with safe_open(str(run / "predict" / "predictions.safetensors"), framework="pt") as f:
        labels = json.loads((f.metadata() or {})["labels"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model: Any = EsmForSequenceClassification.from_pretrained(run / "hf", attn_implementation="sdpa")
    model = model.to(device).eval()
    id2label = model.config.id2label or {}
    if [id2label.get(i) for i in range(len(labels))] != labels:
        raise SystemExit(f"convert to-hf: id2label {id2label} is not the predictions' labels {labels}")
    gap = 0.0
    with torch.no_grad():
        for start in range(0, len(rows), 16):
            tokens = padded([TOKENIZER.encode(row["sequence"]) for row in rows[start : start + 16]]).to(device)
            logits = model(input_ids=tokens, attention_mask=tokens != TOKENIZER.pad_id).logits.float()
            ours = tensors["probabilities"][start : start + 16].float().to(device)
            gap = max(gap, (logits.softmax(-1) - ours).abs().max().item())
    del model
    return {"predict_wall_seconds": wall, "rows": len(rows), "max_probability_gap_vs_transformers": gap}


def _checked(command: list[str], what: str) -> None:
    """Run ``command``; exits (``SystemExit``, naming ``what``) with the command and its output's tail on stderr when
    it fails."""
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        print(shlex.join(command), result.stdout[-3000:], result.stderr[-3000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"{what} failed ({result.returncode})")


def finetune_subprocess(command: list[str], out: Path, what: str) -> tuple[dict[str, Any], float]:
    """Run ``command`` (a ``run finetune`` writing into ``out``): its ``summary.json`` and wall seconds.

    Exits (``SystemExit``, naming ``what``) with the command and its output's tail on stderr when it fails.
    """
    started = time.perf_counter()
    _checked(command, what)
    wall = time.perf_counter() - started
    return json.loads((out / "summary.json").read_text()), wall


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def bench_shape(key: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    shape = model_shape(key)
    folder = root / f"hf_{key}"
    save_random_hf(folder, shape, seed=0)
    sequences = random_proteins(args.sequences, seed=1)
    train = write_csv(root / f"train_{key}.csv", sequences, seed=2)
    val = write_csv(root / f"val_{key}.csv", random_proteins(max(8, args.sequences // 20), seed=3), seed=4)
    result: dict[str, Any] = {"shape": key, "modes": {}}
    for mode in args.modes:
        hf = None if args.skip_hf else bench_hf(folder, sequences, mode, args)
        ours = run_ours(folder, train, val, root / f"run_{key}_{mode}", mode, args)
        result["modes"][mode] = {"hf": hf, "ours": ours}
        ours_rate, hf_rate = ours.get("train_tokens_per_second"), hf["tokens_per_second"] if hf else None
        print(
            f"{key} {mode}: ours {ours_rate or 0:,.0f} tokens/s, peak {ours.get('peak_memory_gib') or 0:.1f} GiB, "
            f"wall {ours['wall_seconds']:.0f} s | transformers{' + peft' if mode == 'lora' else ''} "
            f"{(hf_rate or 0):,.0f} tokens/s, peak {((hf or {}).get('peak_memory_gib') or 0):.1f} GiB | "
            f"ratio {_ratio(ours_rate, hf_rate)}",
            flush=True,
        )
        if args.predict:
            checked = predict_and_export(root / f"run_{key}_{mode}", val)
            result["modes"][mode]["predict"] = checked
            print(
                f"{key} {mode} predict: {checked['rows']} rows in {checked['predict_wall_seconds']:.1f} s (whole "
                f"command); probabilities vs the to-hf export in transformers: max gap "
                f"{checked['max_probability_gap_vs_transformers']:.2e}",
                flush=True,
            )
    if {"full", "lora"} <= set(result["modes"]):
        full, lora = (result["modes"][m]["ours"].get("peak_memory_gib") for m in ("full", "lora"))
        print(f"{key}: LoRA / full peak memory (ours) {_ratio(lora, full)}", flush=True)
    if args.frozen:
        ours = run_ours(folder, train, val, root / f"run_{key}_frozen", "frozen", args)
        head = ours.get("timed_seconds") or 0.0
        encode = ours.get("encode_seconds") or 0.0
        once, every = encode + head, 10 * encode + head
        result["frozen"] = {"encode_seconds": encode, "head_seconds": head, "speedup": every / once if once else None}
        print(f"{key} frozen, 10 passes: encode once {encode:.1f} s + head {head:.1f} s; re-encoding every pass "
              f"{every:.1f} s: {_ratio(every, once)} faster", flush=True)  # fmt: skip
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--shapes", default="650m", help="Comma-separated: demo, 8m, 35m, 150m, 650m, ...")
    parser.add_argument("--sequences", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=30, help="Timed steps per run.")
    parser.add_argument("--warm-up", type=int, default=3, help="Untimed transformers steps first.")
    parser.add_argument("--batch", type=int, default=16, help="Sequences per step of transformers + peft.")
    parser.add_argument("--modes", default="full,lora", help="Comma-separated: full, lora.")
    parser.add_argument("--frozen", action="store_true", help="Also time --encoder frozen over 10 passes.")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument(
        "--predict", action="store_true", help="Also predict with each fine-tuned model and check its to-hf export."
    )
    parser.add_argument(
        "--ours-flags",
        type=shlex.split,
        default=[],
        help="More `run finetune` flags, e.g. --ours-flags='--global-batch-size 16 --micro-batch-size 16' "
        "(default: its defaults, batches of 16,384 tokens on GPUs)",
    )
    parser.add_argument("--out", type=Path, default=None, help="Keep runs and write results.json here.")
    args = parser.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(args.modes) - {"full", "lora"})
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; valid: full, lora")
    return args


def main() -> None:
    args = parse_args()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (smoke run, float32)"
    print(f"device: {device}", flush=True)
    with tempfile.TemporaryDirectory() as temporary:
        root = args.out or Path(temporary)
        root.mkdir(parents=True, exist_ok=True)
        results = [bench_shape(key, args, root) for key in args.shapes.split(",")]
        (root / "results.json").write_text(json.dumps({"device": device, "results": results}, indent=1))
        if args.out is None:
            print(json.dumps(results, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
