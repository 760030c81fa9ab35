"""``--class-weights balanced``: classes weighted n / (k * n_c) in the loss (bionemo.esm2.finetune.class_weights).

Weights against their definition counted here; the loss against cross-entropy written out in plain torch; a run's
logged ``val_loss`` against the weighted cross-entropy of its own exported model's validation predictions, for the
full (megatron module) and frozen (cached head) paths; the option's checks; a rerun with other weights refused.
"""

import csv
import json
import math
from collections import Counter

import pytest
import torch

from bionemo.esm2.finetune.api import finetune
from bionemo.esm2.finetune.class_weights import ClassWeights
from bionemo.esm2.finetune.objectives import loss_sum
from bionemo.esm2.finetune.options import finetune_options
from bionemo.esm2.finetune.tasks import LabelledRecord, LabelVocabulary, OptionError, Task
from bionemo.recipes.settings import RunSettings, SettingsError
from support.finetune_data import rows


def test_balanced_weights_are_n_over_classes_times_count():
    labels = ["a"] * 6 + ["b"] * 3 + ["c"]
    records = [LabelledRecord(id=f"r{i}", sequence="MKV", labels=(label,)) for i, label in enumerate(labels)]
    vocabulary = LabelVocabulary(task=Task.CLASSIFICATION, columns=("label",), classes=("a", "b", "c"))
    weights = ClassWeights.balanced(Task.CLASSIFICATION, records, vocabulary)
    counts = Counter(labels)
    assert weights.weights == pytest.approx([10 / (3 * counts[c]) for c in "abc"])
    assert math.fsum(weights.weights[vocabulary.classes.index(label)] for label in labels) == pytest.approx(10)
    assert ClassWeights.from_json(weights.to_json()) == weights
    assert ClassWeights.from_json("null") is None
    assert weights.label(vocabulary) == "a 0.556, b 1.11, c 3.33"


def test_token_classification_counts_the_scored_residues_only():
    records = [
        LabelledRecord("a", "MKVL", "HHHE", mask=(True, True, False, False)),  # H, H scored; H, E not
        LabelledRecord("b", "MK", "HC"),
    ]
    vocabulary = LabelVocabulary(task=Task.TOKEN_CLASSIFICATION, columns=("ss",), classes=("C", "E", "H"))
    weights = ClassWeights.balanced(Task.TOKEN_CLASSIFICATION, records, vocabulary)
    # 4 scored residues: C once, H three times; E is never scored (weight 0, two classes present)
    assert weights.weights == pytest.approx([4 / (2 * 1), 0.0, 4 / (2 * 3)])
    with pytest.raises(ValueError, match="classification, multilabel and token-classification"):
        ClassWeights.balanced(Task.REGRESSION, records, vocabulary)


def test_multilabel_weighs_each_labels_ones_and_zeros():
    labels = [(1.0, 0.0), (0.0, 0.0), (0.0, 1.0), (0.0, 1.0)]  # c: one 1 in 4; w: two in 4
    records = [LabelledRecord(id=f"r{i}", sequence="MKV", labels=values) for i, values in enumerate(labels)]
    vocabulary = LabelVocabulary(task=Task.MULTILABEL, columns=("c", "w"), classes=())
    weights = ClassWeights.balanced(Task.MULTILABEL, records, vocabulary)
    assert weights.weights == pytest.approx([4 / (2 * 1), 4 / (2 * 2)])  # the 1s
    assert weights.negatives == pytest.approx([4 / (2 * 3), 4 / (2 * 2)])  # the 0s
    assert weights.by_name(vocabulary) == {"c": {"0": pytest.approx(2 / 3), "1": 2.0}, "w": {"0": 1.0, "1": 1.0}}
    assert weights.label(vocabulary) == "c 0/1 0.667/2, w 0/1 1/1"
    assert ClassWeights.from_json(weights.to_json()) == weights
    torch.testing.assert_close(weights.on(torch.device("cpu")), torch.tensor([weights.negatives, weights.weights]))


@pytest.mark.parametrize("task", [Task.CLASSIFICATION, Task.TOKEN_CLASSIFICATION])
def test_the_loss_weighs_each_items_cross_entropy_by_its_class(task):
    torch.manual_seed(0)
    weights = torch.tensor([0.5, 2.0, 1.25])
    shape = (6,) if task is Task.CLASSIFICATION else (3, 5)
    logits, target = torch.randn(*shape, 3), torch.randint(0, 3, shape)
    mask = torch.rand(shape) > 0.3
    total, count = loss_sum(task, logits, target, mask, class_weights=weights)
    log_probs = logits.log_softmax(dim=-1)
    expected = sum(
        -weights[target[i]] * log_probs[i][target[i]] for i in map(tuple, mask.nonzero().tolist())
    )  # plain cross-entropy, item by item
    torch.testing.assert_close(total, torch.as_tensor(expected))
    assert int(count) == int(mask.sum())  # the count stays the item count
    unweighted, _ = loss_sum(task, logits, target, mask)
    torch.testing.assert_close(loss_sum(task, logits, target, mask, class_weights=torch.ones(3))[0], unweighted)


def test_multilabel_binary_cross_entropy_weighs_each_label_by_its_value():
    torch.manual_seed(1)
    weights = torch.tensor([[0.5, 1.0, 0.75], [3.0, 1.0, 1.5]])  # [0s, 1s] per label
    logits, target = torch.randn(5, 3), torch.randint(0, 2, (5, 3)).float()
    mask = torch.tensor([True, True, False, True, True])
    total, count = loss_sum(Task.MULTILABEL, logits, target, mask, class_weights=weights)
    p = logits.sigmoid()
    per_label = -(target * p.log() + (1 - target) * (1 - p).log())  # binary cross-entropy, written out
    weight = torch.where(target > 0.5, weights[1], weights[0])
    torch.testing.assert_close(total, (per_label * weight).mean(dim=1)[mask].sum())
    assert int(count) == 4


def test_the_option_is_for_tasks_with_classes():
    with pytest.raises(OptionError, match="--task regression has none") as error:
        finetune_options(RunSettings(task="regression", label_column=["y"], class_weights="balanced"))
    assert error.value.option == "--class-weights"
    with pytest.raises(OptionError, match="valid are none, balanced"):
        finetune_options(RunSettings(task="classification", label_column=["y"], class_weights="inverse"))
    options = finetune_options(RunSettings(task="classification", label_column=["y"], class_weights="Balanced"))
    assert options.class_weights == "balanced"


def _imbalanced(count: int, seed: int) -> list[dict[str, str]]:
    """About 4 hyd to 1 pol."""
    table = rows(count * 2, seed)
    hyd, pol = [r for r in table if r["kind"] == "hyd"], [r for r in table if r["kind"] == "pol"]
    return hyd[: count * 4 // 5] + pol[: count // 5]


@pytest.mark.parametrize("encoder", ["full", "frozen"])
def test_a_run_trains_and_validates_on_the_weighted_loss(base, tmp_path, encoder):
    train, val = _imbalanced(40, seed=1), _imbalanced(20, seed=2)
    out = tmp_path / "run"
    model = finetune(
        base, [r["sequence"] for r in train], [r["kind"] for r in train], task="classification",
        val_sequences=[r["sequence"] for r in val], val_labels=[r["kind"] for r in val], encoder=encoder,
        class_weights="balanced", max_steps=2, val_check_interval=2, output_dir=out, accelerator="cpu",
    )  # fmt: skip
    counts = Counter(r["kind"] for r in train)
    expected = {c: len(train) / (2 * counts[c]) for c in ("hyd", "pol")}
    assert json.loads((out / "summary.json").read_text())["class_weights"] == pytest.approx(expected)

    # the last validation ran on the exported weights (the only one): its val_loss is their weighted cross-entropy
    with (out / "logs" / "metrics.csv").open() as f:
        logged = [float(row["val_loss"]) for row in csv.DictReader(f) if row.get("val_loss")]
    probabilities = model.predict([r["sequence"] for r in val], accelerator="cpu").outputs
    targets = [model.spec.labels.classes.index(r["kind"]) for r in val]
    weighted = [-expected[r["kind"]] * math.log(float(probabilities[i, t])) for i, (r, t) in
                enumerate(zip(val, targets, strict=True))]  # fmt: skip
    assert logged[-1] == pytest.approx(sum(weighted) / len(val), rel=1e-4)

    # the weights define the run: a rerun without them is another run
    with pytest.raises(SettingsError, match="class_weights"):
        finetune(
            base, [r["sequence"] for r in train], [r["kind"] for r in train], task="classification",
            val_sequences=[r["sequence"] for r in val], val_labels=[r["kind"] for r in val], encoder=encoder,
            max_steps=3, val_check_interval=2, output_dir=out, accelerator="cpu",
        )  # fmt: skip


def test_a_multilabel_run_validates_on_the_weighted_binary_cross_entropy(base, tmp_path):
    train, val = rows(40, seed=3), rows(16, seed=4)
    columns = ("has_c", "has_w")
    labels = [tuple(int(r[c]) for c in columns) for r in train]
    out = tmp_path / "run"
    model = finetune(
        base, [r["sequence"] for r in train], labels, task="multilabel", label_columns=columns,
        val_sequences=[r["sequence"] for r in val], val_labels=[tuple(int(r[c]) for c in columns) for r in val],
        encoder="frozen", class_weights="balanced", max_steps=2, val_check_interval=2, output_dir=out,
        accelerator="cpu",
    )  # fmt: skip
    ones = [sum(label[j] for label in labels) for j in range(2)]
    summary = json.loads((out / "summary.json").read_text())["class_weights"]
    assert summary == {c: {"0": pytest.approx(40 / (2 * (40 - k))), "1": pytest.approx(40 / (2 * k))}
                       for c, k in zip(columns, ones, strict=True)}  # fmt: skip
    with (out / "logs" / "metrics.csv").open() as f:
        logged = [float(row["val_loss"]) for row in csv.DictReader(f) if row.get("val_loss")]
    p = model.predict([r["sequence"] for r in val], accelerator="cpu").outputs.double()
    target = torch.tensor([[int(r[c]) for c in columns] for r in val], dtype=torch.float64)
    weight = torch.tensor([[summary[c][str(int(v))] for c, v in zip(columns, row, strict=True)] for row in
                           target.tolist()], dtype=torch.float64)  # fmt: skip
    per_label = -(target * p.log() + (1 - target) * (1 - p).log())
    assert logged[-1] == pytest.approx(float((per_label * weight).mean(dim=1).mean()), rel=1e-4)
