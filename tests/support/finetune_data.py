"""Labelled CSVs of learnable synthetic tasks for fine-tuning tests (a tiny random ESM-2 learns them in seconds).

Sequences mix hydrophobic (LIVFM) and polar (DEKRNQST) residues, mostly one kind or the other:

- ``kind``: ``hyd`` or ``pol`` (classification), the kind the sequence was drawn from;
- ``score``: the share of hydrophobic residues (regression);
- ``has_c`` / ``has_w``: whether C / W occur (multilabel, 0/1);
- ``ss``: ``H`` at hydrophobic residues, ``C`` elsewhere (token-classification), ``resolved`` a 0/1 mask;
- ``hydro``: +1 at hydrophobic residues, -1 elsewhere, space-separated (token-regression).
"""

import csv
import os
import random
from pathlib import Path

HYDROPHOBIC = "LIVFM"
POLAR = "DEKRNQST"
COLUMNS = ("id", "sequence", "kind", "score", "has_c", "has_w", "ss", "resolved", "hydro")


def rows(count: int, seed: int) -> list[dict[str, str]]:
    """``count`` labelled rows drawn from ``seed`` (ids ``s{seed}_{i}``)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        kind = rng.choice(["hyd", "pol"])
        pool = HYDROPHOBIC * 3 + POLAR if kind == "hyd" else POLAR * 3 + HYDROPHOBIC
        residues = [rng.choice(pool) for _ in range(rng.randint(15, 45))]
        for extra in "CW":
            if rng.random() < 0.5:
                residues[rng.randrange(len(residues))] = extra
        sequence = "".join(residues)
        out.append(
            {
                "id": f"s{seed}_{i}",
                "sequence": sequence,
                "kind": kind,
                "score": f"{sum(c in HYDROPHOBIC for c in sequence) / len(sequence):.6f}",
                "has_c": str(int("C" in sequence)),
                "has_w": str(int("W" in sequence)),
                "ss": "".join("H" if c in HYDROPHOBIC else "C" for c in sequence),
                "resolved": "".join(rng.choice("1111110") for _ in sequence),
                "hydro": " ".join("1" if c in HYDROPHOBIC else "-1" for c in sequence),
            }
        )
    return out


def write_csv(path: Path, count: int, seed: int) -> Path:
    """Write :func:`rows` to ``path``."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows(count, seed))
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def gpu_run_files(root: Path) -> dict[str, Path]:
    """A small random Hugging Face base and ``kind`` train / val / test CSVs under ``root``, with the GPU log folder.

    What the GPU fine-tuning tests run on: a 4-layer, 128-wide model learns ``kind`` to >= 0.9 accuracy in 60 steps.
    Logs go to ``$BIONEMO_GPU_LOG_DIR`` (default ``/tmp/bionemo-gpu-logs``).
    """
    from support.hf_esm import random_hf_esm

    random_hf_esm(root / "base", hidden=128, heads=4, layers=4)
    logs = Path(os.environ.get("BIONEMO_GPU_LOG_DIR", "/tmp/bionemo-gpu-logs"))
    logs.mkdir(parents=True, exist_ok=True)
    return {
        "root": root,
        "base": root / "base",
        "logs": logs,
        "train": write_csv(root / "train.csv", 320, seed=1),
        "val": write_csv(root / "val.csv", 48, seed=2),
        "test": write_csv(root / "test.csv", 96, seed=3),
    }
