"""Fine-tuning metrics against plain computations written out here (no sklearn, no scipy)."""

import pytest
import torch

from bionemo.esm2.finetune.metrics import BEST_METRIC, METRIC_NAMES, Mode, TaskMetrics
from bionemo.esm2.finetune.tasks import Task

torch.manual_seed(0)


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    return float((x * y).sum() / (x.square().sum() * y.square().sum()).sqrt())


def ranks(x: torch.Tensor) -> torch.Tensor:
    return x.argsort().argsort().double()  # continuous random values: no ties


def auroc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """P(a positive scores above a negative), ties counting half (Mann-Whitney)."""
    pos, neg = scores[positive.bool()], scores[~positive.bool()]
    diff = pos[:, None] - neg[None, :]
    return float((diff > 0).double().mean() + 0.5 * (diff == 0).double().mean())


def f1(predicted: torch.Tensor, actual: torch.Tensor) -> float:
    tp = (predicted & actual).sum().item()
    fp = (predicted & ~actual).sum().item()
    fn = (~predicted & actual).sum().item()
    return 2 * tp / (2 * tp + fp + fn)


def computed(task, k, *batches):
    metrics = TaskMetrics(task, k)
    for batch in batches:
        metrics.update(*batch)
    values = {key: value.item() for key, value in metrics.compute().items()}
    assert list(values) == [f"val_{name}" for name in METRIC_NAMES[task]]
    assert BEST_METRIC[task].key in values
    return values


def test_regression_mse_pearson_spearman_mean_over_columns():
    target = torch.randn(40, 2)
    logits = target + 0.8 * torch.randn(40, 2)
    got = computed(Task.REGRESSION, 2, (logits[:25], target[:25]), (logits[25:], target[25:]))
    assert got["val_mse"] == pytest.approx(float((logits - target).square().mean()), rel=1e-5)
    expected_pearson = sum(pearson(logits[:, j], target[:, j]) for j in range(2)) / 2
    assert got["val_pearson"] == pytest.approx(expected_pearson, rel=1e-4)
    expected_spearman = sum(pearson(ranks(logits[:, j]), ranks(target[:, j])) for j in range(2)) / 2
    assert got["val_spearman"] == pytest.approx(expected_spearman, rel=1e-4)
    one = computed(Task.REGRESSION, 1, (logits[:, :1], target[:, :1]))
    assert one["val_spearman"] == pytest.approx(pearson(ranks(logits[:, 0]), ranks(target[:, 0])), rel=1e-4)


def test_classification_accuracy_f1_auroc_mcc():
    n, k = 90, 3
    target = torch.arange(n) % k
    logits = torch.randn(n, k) + 1.5 * torch.nn.functional.one_hot(target, k)
    got = computed(Task.CLASSIFICATION, k, (logits[:50], target[:50]), (logits[50:], target[50:]))
    predicted = logits.argmax(-1)
    assert got["val_accuracy"] == pytest.approx(float((predicted == target).double().mean()), rel=1e-6)
    macro_f1 = sum(f1(predicted == c, target == c) for c in range(k)) / k
    assert got["val_f1_macro"] == pytest.approx(macro_f1, rel=1e-5)
    probabilities = logits.softmax(-1)
    macro_auroc = sum(auroc(probabilities[:, c], target == c) for c in range(k)) / k
    assert got["val_auroc"] == pytest.approx(macro_auroc, rel=1e-5)
    # multiclass MCC from the confusion counts: (c*s - sum p_k t_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2))
    c, s = float((predicted == target).sum()), float(n)
    p = torch.bincount(predicted, minlength=k).double()
    t = torch.bincount(target, minlength=k).double()
    mcc = (c * s - float((p * t).sum())) / ((s**2 - float(p.square().sum())) * (s**2 - float(t.square().sum()))) ** 0.5
    assert got["val_mcc"] == pytest.approx(mcc, rel=1e-5)


def test_multilabel_micro_and_macro_auroc_and_f1():
    n, k = 60, 3
    target = (torch.rand(n, k) > 0.5).long()
    target[0], target[1] = 1, 0  # every label has both values
    logits = torch.randn(n, k) + 1.2 * (2 * target - 1)
    got = computed(Task.MULTILABEL, k, (logits, target.float()))
    probabilities = logits.sigmoid()
    predicted, actual = probabilities >= 0.5, target.bool()
    assert got["val_auroc_micro"] == pytest.approx(auroc(probabilities.reshape(-1), target.reshape(-1)), rel=1e-5)
    macro = sum(auroc(probabilities[:, j], target[:, j]) for j in range(k)) / k
    assert got["val_auroc_macro"] == pytest.approx(macro, rel=1e-5)
    assert got["val_f1_micro"] == pytest.approx(f1(predicted, actual), rel=1e-5)
    macro_f1 = sum(f1(predicted[:, j], actual[:, j]) for j in range(k)) / k
    assert got["val_f1_macro"] == pytest.approx(macro_f1, rel=1e-5)


def test_token_metrics_exclude_unscored_residues():
    b, s, k = 4, 11, 3
    logits = torch.randn(b, s, k)
    target = torch.randint(0, k, (b, s))
    mask = torch.rand(b, s) > 0.3
    target[~mask] = -100  # never read
    got = computed(Task.TOKEN_CLASSIFICATION, k, (logits[:2], target[:2], mask[:2]), (logits[2:], target[2:], mask[2:]))
    expected = float((logits.argmax(-1)[mask] == target[mask]).double().mean())
    assert got["val_accuracy"] == pytest.approx(expected, rel=1e-6)
    values = torch.randn(b, s)
    predicted = values + torch.randn(b, s)
    values[~mask] = torch.nan
    got = computed(Task.TOKEN_REGRESSION, 1, (predicted.unsqueeze(-1), values, mask))
    assert got["val_mse"] == pytest.approx(float((predicted[mask] - values[mask]).square().mean()), rel=1e-5)
    assert got["val_pearson"] == pytest.approx(pearson(predicted[mask], values[mask]), rel=1e-4)
    assert got["val_spearman"] == pytest.approx(pearson(ranks(predicted[mask]), ranks(values[mask])), rel=1e-4)
    with pytest.raises(ValueError, match="needs a mask"):
        TaskMetrics(Task.TOKEN_CLASSIFICATION, k).update(logits, target)


@pytest.mark.parametrize("task", [Task.REGRESSION, Task.CLASSIFICATION, Task.MULTILABEL])
def test_repeated_samples_change_no_value(task):
    """What tensor-parallel ranks holding the same samples amount to when states are synced over all processes."""
    n, k = 30, 3
    target = {
        Task.REGRESSION: torch.randn(n, k),
        Task.CLASSIFICATION: torch.arange(n) % k,
        Task.MULTILABEL: torch.cat([torch.eye(k), 1 - torch.eye(k), (torch.rand(n - 2 * k, k) > 0.5).float()]),
    }[task]
    logits = torch.randn(n, k)
    once = computed(task, k, (logits, target))
    twice = computed(task, k, (logits, target), (logits, target))
    assert twice == pytest.approx(once, rel=1e-5)


def test_reset_and_best_metric_modes():
    metrics = TaskMetrics(Task.TOKEN_CLASSIFICATION, 2, prefix="test_")
    logits, target = torch.tensor([[[2.0, 0.0], [0.0, 2.0]]]), torch.tensor([[0, 0]])
    metrics.update(logits, target, torch.tensor([[True, True]]))
    assert metrics.compute()["test_accuracy"].item() == pytest.approx(0.5)
    metrics.reset()
    metrics.update(logits, target, torch.tensor([[True, False]]))
    assert metrics.compute()["test_accuracy"].item() == pytest.approx(1.0)
    assert set(BEST_METRIC) == set(Task)
    assert all(best.mode is Mode.MAX for best in BEST_METRIC.values())  # all scores/correlations here


def _mcc(predicted: torch.Tensor, target: torch.Tensor, k: int) -> float:
    """The multiclass MCC from the confusion counts, 0 where its denominator is 0 (scikit-learn's convention)."""
    c, s = float((predicted == target).sum()), float(len(target))
    p = torch.bincount(predicted, minlength=k).double()
    t = torch.bincount(target, minlength=k).double()
    denominator = (s**2 - float(p.square().sum())) * (s**2 - float(t.square().sum()))
    return (c * s - float((p * t).sum())) / denominator**0.5 if denominator > 0 else 0.0


@pytest.mark.parametrize(
    ("predicted", "target"),
    [
        ([0] * 8, [0] * 7 + [1]),  # one class predicted for every sequence: torchmetrics 1.9 says 0.80
        ([1] * 8, [0] * 7 + [1]),  # ... and -0.80 for the other class
        ([0] * 4, [0] * 4),  # one class in the targets too
        ([0, 1, 0, 1], [1, 1, 1, 1]),
        ([0, 1, 1, 0], [0, 1, 1, 0]),  # perfect
        ([1, 0, 0, 1], [0, 1, 1, 0]),  # inverted
        ([0, 2, 2, 0, 1], [0, 2, 1, 0, 2]),
    ],
)
def test_mcc_is_zero_where_undefined_and_the_formula_elsewhere(predicted, target):
    k = 3 if 2 in predicted + target else 2
    logits = torch.nn.functional.one_hot(torch.tensor(predicted), k).float()
    got = computed(Task.CLASSIFICATION, k, (logits, torch.tensor(target)))
    assert got["val_mcc"] == pytest.approx(_mcc(torch.tensor(predicted), torch.tensor(target), k), abs=1e-6)


def test_a_constant_predictor_is_not_the_best_validation():
    """What val_mcc chooses the exported weights by: a model that learned beats one that predicts the majority."""
    target = torch.tensor([0] * 7 + [1])
    constant = computed(Task.CLASSIFICATION, 2, (torch.tensor([[1.0, 0.0]] * 8), target))["val_mcc"]
    learned = torch.tensor([[1.0, 0.0]] * 6 + [[0.0, 1.0]] * 2)  # one error: a majority sample called minority
    assert computed(Task.CLASSIFICATION, 2, (learned, target))["val_mcc"] > constant == 0.0
