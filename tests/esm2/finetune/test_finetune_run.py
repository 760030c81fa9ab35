"""``bionemo run finetune`` then ``run predict`` on CPU: learnable synthetic tasks, held-out quality, file contents.

The base is a tiny random Hugging Face ESM-2 built here; the tasks (tests/support/finetune_data.py) are learnable
from residue identity, so a few dozen steps reach held-out thresholds a broken loss, head or export would miss.
"""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from bionemo.esm2.finetune.spec import FINETUNE_KEY, FinetuneSpec
from bionemo.esm2.hf.layout import CONTACT_HEAD
from bionemo.recipes.outputs import read_predictions, split_residues
from support.cli_runs import bionemo
from support.finetune_data import read_csv, write_csv
from support.hf_esm import random_hf_esm


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("finetune")
    random_hf_esm(root / "base", hidden=64, heads=4, layers=2)
    return {
        "root": root,
        "base": root / "base",
        "train": write_csv(root / "train.csv", 160, seed=1),
        "val": write_csv(root / "val.csv", 32, seed=2),
        "test": write_csv(root / "test.csv", 48, seed=3),
    }


def _finetune(files: dict[str, Path], name: str, *args: str) -> Path:
    out = files["root"] / name
    bionemo(
        "run", "finetune", "--checkpoint", str(files["base"]), "--data", str(files["train"]),
        "--val-data", str(files["val"]), "--output-dir", str(out), "--accelerator", "cpu", *args,
        cwd=files["root"],
    )  # fmt: skip
    return out


def _predict(files: dict[str, Path], run: Path, data: Path, name: str, *args: str) -> Path:
    out = files["root"] / name
    result = bionemo(
        "run", "predict", "--checkpoint", str(run / "model.safetensors"), "--data", str(data),
        "--output-dir", str(out), "--accelerator", "cpu", *args,
        cwd=files["root"],
    )  # fmt: skip
    best = _metadata(run / "model.safetensors")["best"]
    summary = " ".join(result.stdout.replace("│", " ").split())
    assert f"validation at fine-tuning best {best['metric']} {best['value']:.4f} at step {best['step']}" in summary
    assert "perplexity" not in summary  # a fine-tuned model has no language-model head
    return out


def _metadata(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return {k: json.loads(v) for k, v in (f.metadata() or {}).items()}


def _spearman(x: list[float], y: list[float]) -> float:
    def ranks(values: list[float]) -> torch.Tensor:
        return torch.tensor(values).argsort().argsort().float()

    return float(torch.corrcoef(torch.stack([ranks(x), ranks(y)]))[0, 1])


def test_classification_full_learns_and_exports_its_best_validation(files):
    run = _finetune(files, "cls", "--task", "classification", "--label-column", "kind", "--max-steps", "40",
                    "--lr", "1e-3", "--val-check-interval", "10")  # fmt: skip
    meta = _metadata(run / "model.safetensors")
    spec = FinetuneSpec.from_json(meta[FINETUNE_KEY])
    assert (spec.task, spec.labels.classes, spec.labels.columns) == ("classification", ("hyd", "pol"), ("kind",))
    assert meta["best"]["metric"] == "val_mcc"
    assert meta["steps"] == 40
    # the base's contact head goes on unchanged, as transformers keeps it in a fine-tuned model
    base = load_file(files["base"] / "model.safetensors")
    weights = load_file(run / "model.safetensors")
    for name in CONTACT_HEAD:
        torch.testing.assert_close(weights[name], base[f"esm.{name}"], rtol=0, atol=0)

    test = _predict(files, run, files["test"], "cls_test")
    truth = read_csv(files["test"])
    table = read_csv(test / "predictions.csv")
    assert [r["id"] for r in table] == [r["id"] for r in truth]  # input order
    assert list(table[0]) == ["id", "kind"]
    accuracy = sum(p["kind"] == t["kind"] for p, t in zip(table, truth, strict=True)) / len(truth)
    assert accuracy >= 0.9, accuracy
    ids, tensors = read_predictions(test / "predictions.safetensors")
    assert tensors["probabilities"].shape == (len(truth), 2)
    torch.testing.assert_close(tensors["probabilities"].sum(dim=1), torch.ones(len(truth)))
    with safe_open(str(test / "predictions.safetensors"), framework="pt") as f:
        assert json.loads(f.metadata()["labels"]) == ["hyd", "pol"]
    assert "embeddings" not in tensors  # a fine-tuned model predicts its head's outputs unless --include says more

    # the exported weights are the best validation's: predicting the validation set gives the recorded MCC
    val = _predict(files, run, files["val"], "cls_val")
    val_truth = [r["kind"] for r in read_csv(files["val"])]
    predicted = [r["kind"] for r in read_csv(val / "predictions.csv")]
    assert math.isclose(_mcc(predicted, val_truth), meta["best"]["value"], abs_tol=1e-5)


def _mcc(predicted: list[str], truth: list[str]) -> float:
    tp = sum(p == t == "hyd" for p, t in zip(predicted, truth, strict=True))
    tn = sum(p == t == "pol" for p, t in zip(predicted, truth, strict=True))
    fp = sum(p == "hyd" != t for p, t in zip(predicted, truth, strict=True))
    fn = sum(p == "pol" != t for p, t in zip(predicted, truth, strict=True))
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / denominator if denominator else 0.0


def test_regression_lora_learns_with_the_base_weights_unchanged(files):
    from bionemo.esm2.checkpoints.load import load_checkpoint

    run = _finetune(files, "lora", "--task", "regression", "--label-column", "score", "--head", "hf",
                    "--encoder", "lora", "--lora-rank", "4", "--lr", "3e-3", "--max-steps", "60",
                    "--val-check-interval", "20")  # fmt: skip
    spec = FinetuneSpec.from_json(_metadata(run / "model.safetensors")[FINETUNE_KEY])
    assert spec.encoder == "lora"
    assert spec.lora is not None
    assert spec.lora.rank == 4
    with safe_open(str(run / "model.safetensors"), framework="pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    base = load_checkpoint(files["base"]).tensors
    encoder = [k for k in saved if not k.startswith("head.") and "lora_" not in k]
    assert encoder
    assert all(torch.equal(saved[k], base[k]) for k in encoder)  # LoRA leaves the base as it was
    factors = [k for k in saved if "lora_B" in k]
    assert len(factors) == 2 * 4  # 2 layers x 4 targets
    assert any(saved[k].abs().sum() > 0 for k in factors)  # trained

    test = _predict(files, run, files["test"], "lora_test", "--include", "embeddings")
    truth = [float(r["score"]) for r in read_csv(files["test"])]
    predicted = [float(r["score"]) for r in read_csv(test / "predictions.csv")]
    assert _spearman(predicted, truth) >= 0.8
    ids, tensors = read_predictions(test / "predictions.safetensors")
    assert tensors["values"].shape == (len(truth), 1)
    assert tensors["embeddings"].shape == (len(truth), 64)

    # trained on standardized labels, exported with the scaling folded into the head: predicting the validation set
    # from the file gives the Spearman the run recorded for these weights
    val = _predict(files, run, files["val"], "lora_val")
    val_truth = [float(r["score"]) for r in read_csv(files["val"])]
    _, val_tensors = read_predictions(val / "predictions.safetensors")
    best = _metadata(run / "model.safetensors")["best"]
    predicted_val = val_tensors["values"][:, 0].tolist()
    assert math.isclose(_spearman_with_ties(predicted_val, val_truth), best["value"], abs_tol=1e-4)


def _spearman_with_ties(x: list[float], y: list[float]) -> float:
    """Spearman's rho with tied values given their mean rank (as torchmetrics ranks them)."""

    def ranks(values: list[float]) -> torch.Tensor:
        order = sorted(range(len(values)), key=values.__getitem__)
        rank = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                rank[order[k]] = (i + j) / 2
            i = j + 1
        return torch.tensor(rank, dtype=torch.float64)

    return float(torch.corrcoef(torch.stack([ranks(x), ranks(y)]))[0, 1])


def test_token_classification_frozen_cache_gives_what_predict_gives(files):
    """The head trained on cached encoder outputs scores the validation set as prediction through the encoder does."""
    run = _finetune(files, "frozen", "--task", "token-classification", "--label-column", "ss", "--mask-column",
                    "resolved", "--encoder", "frozen", "--head", "hf", "--lr", "1e-2", "--max-steps", "40",
                    "--val-check-interval", "10")  # fmt: skip
    meta = _metadata(run / "model.safetensors")
    assert meta["best"]["metric"] == "val_accuracy"
    val = _predict(files, run, files["val"], "frozen_val")
    rows = read_csv(files["val"])
    table = read_csv(val / "predictions.csv")
    assert [len(p["ss"]) for p in table] == [len(r["sequence"]) for r in rows]
    scored = [(p, t) for row, out in zip(rows, table, strict=True)
              for p, t, m in zip(out["ss"], row["ss"], row["resolved"], strict=True) if m == "1"]  # fmt: skip
    accuracy = sum(p == t for p, t in scored) / len(scored)
    assert math.isclose(accuracy, meta["best"]["value"], abs_tol=1e-5)
    assert accuracy >= 0.75  # chance is about 0.5 (half the residues are hydrophobic); a random frozen encoder
    ids, tensors = read_predictions(val / "predictions.safetensors")
    per_residue = split_residues(tensors, "probabilities")
    assert [p.shape for p in per_residue] == [(len(r["sequence"]), 2) for r in rows]


@pytest.mark.parametrize(
    ("task", "columns", "head", "check"),
    [
        ("multilabel", ["has_c", "has_w"], "mlp", lambda cell: cell in ("0", "1")),
        ("token-regression", ["hydro"], "conv", lambda cell: all(math.isfinite(float(v)) for v in cell.split())),
    ],
)
def test_every_task_predicts_its_csv_cells(files, task, columns, head, check):
    run = _finetune(files, task, "--task", task, *(a for c in columns for a in ("--label-column", c)),
                    "--head", head, "--max-steps", "3")  # fmt: skip
    out = _predict(files, run, files["test"], f"{task}_test")
    table = read_csv(out / "predictions.csv")
    assert list(table[0]) == ["id", *columns]
    rows = read_csv(files["test"])
    for row, truth in zip(table, rows, strict=True):
        for column in columns:
            assert check(row[column])
            if task == "token-regression":
                assert len(row[column].split()) == len(truth["sequence"])
