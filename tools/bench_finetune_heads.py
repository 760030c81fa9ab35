"""Validation quality of the fine-tuning heads (``--head``) per task and encoder mode: which head to default to.

Per task, seed and encoder mode, every head the task can use is fine-tuned by ``bionemo run finetune`` (a subprocess,
the CLI's defaults otherwise: the mode's learning rate, warm-up then cosine, the heads' dropout) for the same
``--steps`` on the same data, and the run's ``summary.json`` gives its best validation metric (the one that chooses
the exported weights: MCC, Spearman, per-residue accuracy; the maximum over ``--validations``, so optimistic by
the validation set's noise) and the last validation's (not chosen). The table shows mean +- std
over the seeds; the line after it names each task's best head: the highest mean over the encoder modes, and in how
many (seed, mode) pairs it beat the other head on the same data.

Synthetic labelled proteins, seeded (seed ``k`` draws data set ``k`` and runs ``--seed k``), 20 amino acids with
lengths uniform in ``--min-length``..``--max-length``; none of the tasks is separable by one residue's count:

* ``regression`` (heads ``hf``, ``mlp``): each sequence has its own composition (Dirichlet-like weights, Gamma(2)
  per amino acid); target the score ``tanh(8 x net charge per residue) + 4 x (hydrophobic fraction - 0.35)`` plus
  Gaussian noise (sd 0.15); charge ``(K + R - D - E) / length``, hydrophobic ``AILMFVW``.
* ``classification`` (``hf``, ``mlp``): compositions drawn as for regression; three classes ``low``, ``mid``,
  ``high`` by the tertiles of the noiseless score (cut points from the training set's scores, applied to both
  sets; ``--class-shares 0.8,0.15,0.05`` for imbalanced classes); 5% of the labels moved to another class at
  random.
* ``token-classification`` (``hf``, ``conv``): a secondary-structure proxy. Sequences are runs of 3-10 residues, each
  run drawn (70%) from helix formers ``AELMQKRH``, strand formers ``VIYFWTC`` or breakers ``GPNDS``; a residue is
  ``H`` if at least 3 of the 5 residues centred on it are helix formers and they outnumber the strand formers,
  ``E`` likewise for strand formers, else ``C``; 5% of the residues relabelled at random.

The base is the bundled demo model (``esm2-demo``, 206K parameters) unless ``--checkpoint`` names another (a Hugging
Face ESM-2 folder, say, on a GPU machine with ``--accelerator gpu``).

Usage: python tools/bench_finetune_heads.py [--tasks classification,regression,token-classification
    --encoders frozen,full,lora --seeds 3 --steps 200 --sequences 300 --val-sequences 300 --min-length 50
    --max-length 150 --validations 5 --checkpoint PATH --accelerator auto|cpu|gpu --out DIR --finetune-flags=...
    --class-shares 0.8,0.15,0.05]
Full measurement (CPU): uv run python tools/bench_finetune_heads.py --encoders frozen,full,lora --seeds 3
    --steps 200 --sequences 300 --accelerator cpu --out bionemo_runs/finetune_heads
CPU smoke: uv run python tools/bench_finetune_heads.py --tasks token-classification --encoders frozen --seeds 1
    --steps 4 --sequences 24 --val-sequences 16 --validations 1 --accelerator cpu
Figures: docs/benchmarks.md#fine-tuning-heads.
"""

import argparse
import bisect
import csv
import itertools
import json
import math
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_finetune import finetune_subprocess  # noqa: E402

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
HEADS = {"classification": ("hf", "mlp"), "regression": ("hf", "mlp"), "token-classification": ("hf", "conv")}
"""The heads each benchmarked task can use (``bionemo.esm2.finetune.head_config.HEADS_FOR_TASK``)."""
ENCODERS = ("frozen", "full", "lora")
LABEL_NOISE = 0.05
CLASSES = ("low", "mid", "high")
"""The classification task's classes, lowest score first: one per quantile of the training set's scores."""
HYDROPHOBIC = frozenset("AILMFVW")
HELIX, STRAND, BREAKER = "AELMQKRH", "VIYFWTC", "GPNDS"
WINDOW = 2  # residues on each side of the labelled one


def _length(rng: random.Random, args: argparse.Namespace) -> int:
    return rng.randint(args.min_length, args.max_length)


def _composition_sequence(rng: random.Random, args: argparse.Namespace) -> tuple[str, float, float]:
    """A sequence of its own composition (Gamma(2) weight per amino acid), its net charge per residue and its
    hydrophobic fraction."""
    weights = [rng.gammavariate(2.0, 1.0) for _ in AMINO_ACIDS]
    sequence = "".join(rng.choices(AMINO_ACIDS, weights=weights, k=_length(rng, args)))
    charge = sum(sequence.count(a) for a in "KR") - sum(sequence.count(a) for a in "DE")
    return sequence, charge / len(sequence), sum(a in HYDROPHOBIC for a in sequence) / len(sequence)


def _score(charge: float, hydrophobic: float) -> float:
    """The noiseless target of both sequence tasks: a smooth function of charge and hydrophobicity."""
    return math.tanh(8 * charge) + 4 * (hydrophobic - 0.35)


def composition_examples(
    rng: random.Random, train: int, val: int, args: argparse.Namespace
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``train`` and ``val`` (sequence, target) pairs: a sequence of its own composition, its score + noise."""
    rows = []
    for _ in range(train + val):
        sequence, charge, hydrophobic = _composition_sequence(rng, args)
        rows.append((sequence, f"{_score(charge, hydrophobic) + rng.gauss(0.0, 0.15):.6g}"))
    return rows[:train], rows[train:]


def score_class_examples(
    rng: random.Random, train: int, val: int, args: argparse.Namespace
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``train`` and ``val`` (sequence, class) pairs: the quantile of the sequence's noiseless score among the
    training set's (:data:`CLASSES`, ``train >= 2``; tertiles, or ``--class-shares``), 5% moved to another class."""
    drawn = [_composition_sequence(rng, args) for _ in range(train + val)]
    scores = [_score(charge, hydrophobic) for _, charge, hydrophobic in drawn]
    if args.class_shares is None:
        cuts = statistics.quantiles(scores[:train], n=len(CLASSES))
    else:  # imbalanced classes: low, mid, high take these shares of the training set
        ordered = sorted(scores[:train])
        ends = itertools.accumulate(args.class_shares[:-1])
        cuts = [ordered[min(len(ordered) - 1, int(end * len(ordered)))] for end in ends]
    rows = []
    for (sequence, _, _), score in zip(drawn, scores, strict=True):
        label = CLASSES[bisect.bisect_right(cuts, score)]
        if rng.random() < LABEL_NOISE:
            label = rng.choice([c for c in CLASSES if c != label])
        rows.append((sequence, label))
    return rows[:train], rows[train:]


def _each(
    example: Callable[[random.Random, argparse.Namespace], tuple[str, str]],
) -> Callable[[random.Random, int, int, argparse.Namespace], tuple[list[tuple[str, str]], list[tuple[str, str]]]]:
    """Train and val sets of examples drawn one at a time by ``example``."""

    def draw(rng: random.Random, train: int, val: int, args: argparse.Namespace):
        rows = [example(rng, args) for _ in range(train + val)]
        return rows[:train], rows[train:]

    return draw


def structure_example(rng: random.Random, args: argparse.Namespace) -> tuple[str, str]:
    """A sequence of helix/strand/breaker-rich runs and its per-residue ``H``/``E``/``C`` string (5% relabelled)."""
    length = _length(rng, args)
    residues: list[str] = []
    while len(residues) < length:
        pool = rng.choice((HELIX, STRAND, BREAKER))
        residues += [
            rng.choice(pool) if rng.random() < 0.7 else rng.choice(AMINO_ACIDS) for _ in range(rng.randint(3, 10))
        ]
    residues = residues[:length]
    labels = []
    for i in range(length):
        window = residues[max(0, i - WINDOW) : i + WINDOW + 1]
        helix, strand = sum(a in HELIX for a in window), sum(a in STRAND for a in window)
        label = "H" if helix >= 3 and helix > strand else "E" if strand >= 3 and strand > helix else "C"
        labels.append(rng.choice("HEC") if rng.random() < LABEL_NOISE else label)
    return "".join(residues), "".join(labels)


EXAMPLES = {
    "classification": score_class_examples,
    "regression": composition_examples,
    "token-classification": _each(structure_example),
}
"""Per task: ``(rng, train, val, args)`` -> the training and the validation (sequence, label) pairs."""


def write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    """``id,sequence,label``: one line per (sequence, label) of ``rows``."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "sequence", "label"])
        for i, row in enumerate(rows):
            writer.writerow([f"p{i}", *row])
    return path


def write_data(root: Path, task: str, seed: int, args: argparse.Namespace) -> tuple[Path, Path]:
    """Data set ``seed`` of ``task``: the training and the validation CSV."""
    train, val = EXAMPLES[task](random.Random(f"{task}-{seed}"), args.sequences, args.val_sequences, args)
    return write_csv(root / f"{task}_{seed}_train.csv", train), write_csv(root / f"{task}_{seed}_val.csv", val)


def run_finetune(
    data: tuple[Path, Path], out: Path, task: str, head: str, encoder: str, seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    """``bionemo run finetune`` on ``data`` (train, val) as a subprocess: the best and last validation metric."""
    train, val = data
    command = [
        sys.executable, "-m", "bionemo.cli", "run", "finetune", "--checkpoint", str(args.checkpoint),
        "--data", str(train), "--val-data", str(val), "--task", task, "--label-column", "label", "--head", head,
        "--encoder", encoder, "--max-steps", str(args.steps),
        "--val-check-interval", str(max(1, args.steps // args.validations)), "--seed", str(seed),
        "--accelerator", args.accelerator, "--output-dir", str(out), "--no-resume", *args.finetune_flags,
    ]  # fmt: skip
    summary, wall = finetune_subprocess(command, out, f"run finetune --task {task} --head {head} --encoder {encoder}")
    metric = summary["best"]["metric"]
    return {
        "task": task,
        "encoder": encoder,
        "head": head,
        "seed": seed,
        "metric": metric,
        "best": summary["best"]["value"],
        "best_step": summary["best"]["step"],
        "last": summary["final_metrics"][metric],
        "wall_seconds": wall,
    }


def _run_line(run: dict[str, Any]) -> str:
    return (
        f"{run['task']} {run['encoder']} {run['head']} seed {run['seed']}: best {run['metric']} {run['best']:.3f} "
        f"at step {run['best_step']}, last {run['last']:.3f} ({run['wall_seconds']:.0f} s)"
    )


def _mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} +- {std:.3f}"


def print_table(runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The table (task, encoder, head, best and last validation metric over the seeds) and each task's best head."""
    print(f"\n{'task':<21} {'encoder':<7} {'head':<5} {'metric':<13} {'best val (mean +- std)':<23} "
          f"{'last val':<16} per seed (best)", flush=True)  # fmt: skip
    for task in args.tasks:
        for encoder in args.encoders:
            for head in HEADS[task]:
                cell = [r for r in runs if (r["task"], r["encoder"], r["head"]) == (task, encoder, head)]
                best = [r["best"] for r in cell]
                print(
                    f"{task:<21} {encoder:<7} {head:<5} {cell[0]['metric']:<13} {_mean_std(best):<23} "
                    f"{_mean_std([r['last'] for r in cell]):<16} {' '.join(f'{v:.3f}' for v in best)}",
                    flush=True,
                )
    print()
    for task in args.tasks:
        first, second = HEADS[task]
        by_head = {h: {(r["encoder"], r["seed"]): r["best"] for r in runs if (r["task"], r["head"]) == (task, h)}
                   for h in (first, second)}  # fmt: skip
        means = {h: statistics.fmean(by_head[h].values()) for h in (first, second)}
        winner, loser = (first, second) if means[first] >= means[second] else (second, first)
        pairs = sorted(by_head[winner])
        wins = sum(by_head[winner][p] > by_head[loser][p] for p in pairs)
        metric = next(r["metric"] for r in runs if r["task"] == task)
        print(
            f"best head for {task}: {winner} (mean {metric} {means[winner]:.3f} vs {loser} {means[loser]:.3f} over "
            f"{', '.join(args.encoders)}; better in {wins} of {len(pairs)} (encoder, seed) pairs)",
            flush=True,
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tasks", default=",".join(HEADS), help=f"Comma-separated: {', '.join(HEADS)}.")
    parser.add_argument("--encoders", default="frozen,full", help=f"Comma-separated: {', '.join(ENCODERS)}.")
    parser.add_argument("--seeds", type=int, default=3, help="Seeds 0..N-1: data set k and `--seed k` per run.")
    parser.add_argument("--steps", type=int, default=200, help="Optimizer steps per run (`--max-steps`).")
    parser.add_argument("--validations", type=int, default=5, help="Validations per run (`--val-check-interval`).")
    parser.add_argument("--sequences", type=int, default=300, help="Training sequences per data set.")
    parser.add_argument("--val-sequences", type=int, default=None, help="Validation sequences (default: --sequences).")
    parser.add_argument("--min-length", type=int, default=50)
    parser.add_argument("--max-length", type=int, default=150)
    parser.add_argument("--checkpoint", type=Path, default=None, help="Base model (default: the bundled demo model).")
    parser.add_argument("--accelerator", default="auto", choices=["auto", "cpu", "gpu"])
    parser.add_argument(
        "--finetune-flags",
        type=shlex.split,
        default=[],
        help="More `run finetune` flags, e.g. --finetune-flags='--lr 1e-3'",
    )
    parser.add_argument(
        "--class-shares",
        type=lambda text: [float(v) for v in text.split(",")],
        default=None,
        help="classification: the shares of low, mid, high (e.g. 0.8,0.15,0.05; default: a third each)",
    )
    parser.add_argument("--out", type=Path, default=None, help="Keep data, runs and results.json here.")
    args = parser.parse_args()
    shares = args.class_shares
    if shares is not None and (len(shares) != len(CLASSES) or min(shares) <= 0 or not math.isclose(sum(shares), 1)):
        parser.error(f"--class-shares {shares}: give {len(CLASSES)} positive shares summing to 1 (low, mid, high)")
    args.tasks = [t for t in args.tasks.split(",") if t]
    args.encoders = [e for e in args.encoders.split(",") if e]
    for flag, given, valid in (("--tasks", args.tasks, HEADS), ("--encoders", args.encoders, ENCODERS)):
        unknown = sorted(set(given) - set(valid))
        if unknown or not given:
            raise SystemExit(f"{flag}: unknown {unknown or given}; valid: {', '.join(valid)}")
    if args.seeds < 1 or args.steps < 1 or args.validations < 1 or args.sequences < 2:
        raise SystemExit("--seeds, --steps and --validations must be >= 1, --sequences >= 2")
    if not 1 <= args.min_length <= args.max_length:
        raise SystemExit("--min-length must be >= 1 and <= --max-length")
    args.val_sequences = args.val_sequences or args.sequences
    return args


def main() -> None:
    args = parse_args()
    if args.checkpoint is None:
        from bionemo.esm2.recipes import BUNDLED_CHECKPOINT

        args.checkpoint = BUNDLED_CHECKPOINT
    print(f"base: {args.checkpoint}; accelerator {args.accelerator}, {os.cpu_count()} CPU cores", flush=True)
    started = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory() as temporary:
        root = args.out or Path(temporary)
        root.mkdir(parents=True, exist_ok=True)
        data = {(task, seed): write_data(root, task, seed, args) for task in args.tasks for seed in range(args.seeds)}
        settings = {key: str(value) for key, value in vars(args).items()}
        for encoder in args.encoders:  # outermost: a run cut short has whole encoder modes
            for (task, seed), files in data.items():
                for head in HEADS[task]:
                    run = run_finetune(
                        files, root / f"run_{task}_{encoder}_{head}_{seed}", task, head, encoder, seed, args
                    )
                    runs.append(run)
                    print(_run_line(run), flush=True)
                    (root / "results.json").write_text(json.dumps({"settings": settings, "runs": runs}, indent=1))
    print_table(runs, args)
    print(f"\n{len(runs)} runs in {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
