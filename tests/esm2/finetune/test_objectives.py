"""Fine-tuning losses as (sum, count) against torch.nn.functional on the unmasked items; targets; CSV decoding."""

import pytest
import torch
import torch.nn.functional as F

from bionemo.esm2.finetune.objectives import csv_cells, loss_sum, predictions, targets
from bionemo.esm2.finetune.tasks import LabelledRecord, LabelVocabulary, Task

torch.manual_seed(0)


def token_batch(b=3, s=9, k=4):
    logits = torch.randn(b, s, k)
    mask = torch.rand(b, s) > 0.4
    return logits, mask


def test_classification_and_multilabel_and_regression_match_functional_means():
    logits, labels = torch.randn(6, 3), torch.tensor([0, 2, 1, 1, 0, 2])
    total, count = loss_sum(Task.CLASSIFICATION, logits, labels)
    torch.testing.assert_close(total / count, F.cross_entropy(logits, labels))
    assert count == 6
    multi = torch.randint(0, 2, (6, 3)).float()
    total, count = loss_sum(Task.MULTILABEL, logits, multi)
    torch.testing.assert_close(total / count, F.binary_cross_entropy_with_logits(logits, multi))
    values = torch.randn(6, 3)
    total, count = loss_sum(Task.REGRESSION, logits, values)  # several columns: mean over the columns
    torch.testing.assert_close(total / count, F.mse_loss(logits, values))
    total, count = loss_sum(Task.REGRESSION, logits[:, :1], values[:, :1])
    torch.testing.assert_close(total / count, F.mse_loss(logits[:, 0], values[:, 0]))


def test_sequence_mask_drops_samples_whatever_their_target():
    logits, labels = torch.randn(5, 3), torch.tensor([0, 2, -100, 1, 7])
    keep = torch.tensor([True, True, False, True, False])
    total, count = loss_sum(Task.CLASSIFICATION, logits, labels, keep)
    torch.testing.assert_close(total / count, F.cross_entropy(logits[keep], labels[keep]))
    assert count == 3
    values = torch.randn(5, 2)
    values[~keep] = torch.nan
    total, count = loss_sum(Task.REGRESSION, logits[:, :2], values, keep)
    torch.testing.assert_close(total / count, F.mse_loss(logits[keep, :2], values[keep]))


def test_token_tasks_are_token_weighted_over_scored_residues():
    logits, mask = token_batch()
    labels = torch.randint(0, 4, mask.shape)
    labels[~mask] = -100  # unscored positions may hold anything
    total, count = loss_sum(Task.TOKEN_CLASSIFICATION, logits, labels, mask)
    assert count == mask.sum()
    torch.testing.assert_close(total / count, F.cross_entropy(logits[mask], labels[mask]))
    # micro-batches summed then divided by the global count: the mean over all scored residues
    halves = [
        loss_sum(Task.TOKEN_CLASSIFICATION, logits[i : i + 2], labels[i : i + 2], mask[i : i + 2]) for i in (0, 2)
    ]
    torch.testing.assert_close(sum(h.total for h in halves) / sum(h.num_items for h in halves), total / count)
    values = torch.randn(mask.shape)
    values[~mask] = torch.nan
    for shaped in (logits[..., :1], logits[..., 0]):  # [b, s, 1] and [b, s]
        total, count = loss_sum(Task.TOKEN_REGRESSION, shaped, values, mask)
        torch.testing.assert_close(total / count, F.mse_loss(logits[..., 0][mask], values[mask]))
    with pytest.raises(ValueError, match="needs a mask"):
        loss_sum(Task.TOKEN_REGRESSION, logits[..., 0], values)


@pytest.mark.parametrize("task", list(Task))
def test_gradients_match_the_indexed_reference_and_ignore_unscored_items(task):
    """Gradients flow to scored items only, as if they were indexed out; NaN logits on unscored items stay out."""
    logits, mask = token_batch(k=3)
    if task.per_residue:
        target = torch.randint(0, 3, mask.shape) if task is Task.TOKEN_CLASSIFICATION else torch.randn(mask.shape)
        if task is Task.TOKEN_REGRESSION:
            logits = logits[..., :1]
    else:
        logits, mask = logits[:, 0], mask[:, 0] | torch.tensor([True, False, False])
        target = torch.randint(0, 3, (3,)) if task is Task.CLASSIFICATION else torch.randint(0, 2, (3, 3)).float()
    reference = logits.clone().requires_grad_()
    ours = logits.clone()
    ours[~mask] = torch.nan
    ours.requires_grad_()
    total, _ = loss_sum(task, ours, target, mask)
    total.backward()
    picked, wanted = reference[mask], target[mask]
    if task in (Task.CLASSIFICATION, Task.TOKEN_CLASSIFICATION):
        expected = F.cross_entropy(picked, wanted, reduction="sum")
    elif task is Task.MULTILABEL:
        expected = F.binary_cross_entropy_with_logits(picked, wanted, reduction="none").mean(dim=-1).sum()
    elif task is Task.REGRESSION:
        expected = F.mse_loss(picked, wanted, reduction="none").mean(dim=-1).sum()
    else:
        expected = F.mse_loss(picked[..., 0], wanted, reduction="sum")
    expected.backward()
    torch.testing.assert_close(total, expected)
    assert ours.grad is not None
    assert reference.grad is not None
    torch.testing.assert_close(ours.grad, reference.grad)
    assert not ours.grad[~mask].any()


def test_empty_mask_gives_zero_sum_and_count():
    logits, mask = token_batch()
    total, count = loss_sum(Task.TOKEN_CLASSIFICATION, logits, torch.zeros_like(mask, dtype=torch.long), mask & False)
    assert (total.item(), count.item()) == (0.0, 0)


def test_predictions_per_task():
    logits = torch.randn(4, 3, dtype=torch.bfloat16)
    torch.testing.assert_close(predictions(Task.CLASSIFICATION, logits), logits.float().softmax(-1))
    torch.testing.assert_close(predictions(Task.MULTILABEL, logits), logits.float().sigmoid())
    torch.testing.assert_close(predictions(Task.REGRESSION, logits), logits.float())
    assert predictions(Task.TOKEN_REGRESSION, torch.randn(2, 5, 1)).shape == (2, 5)
    assert predictions(Task.TOKEN_CLASSIFICATION, torch.randn(2, 5, 3)).sum(-1).allclose(torch.ones(2, 5))


def test_targets_place_residue_i_at_position_i_plus_1():
    records = [
        LabelledRecord("a", "ACD", "HEC", (True, False, True)),
        LabelledRecord("b", "AC", "CC"),
    ]
    vocab = LabelVocabulary(task=Task.TOKEN_CLASSIFICATION, columns=("ss",), classes=("C", "E", "H"))
    target, mask = targets(Task.TOKEN_CLASSIFICATION, records, vocab)
    assert target.tolist() == [[0, 2, 1, 0, 0], [0, 0, 0, 0, 0]]
    assert mask.tolist() == [[False, True, False, True, False], [False, True, True, False, False]]
    logits = torch.randn(2, 5, 3)
    total, count = loss_sum(Task.TOKEN_CLASSIFICATION, logits, target, mask)
    expected = F.cross_entropy(
        torch.stack([logits[0, 1], logits[0, 3], logits[1, 1], logits[1, 2]]), torch.tensor([2, 0, 0, 0])
    )  # noqa: E501
    torch.testing.assert_close(total / count, expected)
    values = [LabelledRecord("a", "AC", (1.5, -2.0))]
    vocab = LabelVocabulary(task=Task.TOKEN_REGRESSION, columns=("p",))
    target, mask = targets(Task.TOKEN_REGRESSION, values, vocab, seq_len=6)
    assert target.tolist() == [[0.0, 1.5, -2.0, 0.0, 0.0, 0.0]]
    assert mask.tolist() == [[False, True, True, False, False, False]]
    with pytest.raises(ValueError, match="seq_len 3 is shorter than sequence 'a'"):
        targets(Task.TOKEN_REGRESSION, values, vocab, seq_len=3)


def test_sequence_targets():
    records = [LabelledRecord("a", "AC", ("y",)), LabelledRecord("b", "AC", ("x",))]
    vocab = LabelVocabulary(task=Task.CLASSIFICATION, columns=("c",), classes=("x", "y"))
    target, mask = targets(Task.CLASSIFICATION, records, vocab)
    assert (target.dtype, target.tolist(), mask.tolist()) == (torch.long, [1, 0], [True, True])
    records = [LabelledRecord("a", "AC", (1.0, 0.0)), LabelledRecord("b", "AC", (0.0, 1.0))]
    vocab = LabelVocabulary(task=Task.MULTILABEL, columns=("p", "q"))
    target, _ = targets(Task.MULTILABEL, records, vocab)
    assert (target.dtype, target.tolist()) == (torch.float32, [[1.0, 0.0], [0.0, 1.0]])


def test_csv_cells_per_task():
    classes = LabelVocabulary(task=Task.CLASSIFICATION, columns=("loc",), classes=("cyto", "nuc"))
    assert csv_cells(Task.CLASSIFICATION, torch.tensor([0.3, 0.7]), classes) == ["nuc"]
    columns = LabelVocabulary(task=Task.REGRESSION, columns=("a", "b"))
    assert csv_cells(Task.REGRESSION, torch.tensor([1.25, -3e-5]), columns) == ["1.25", "-3e-05"]
    multi = LabelVocabulary(task=Task.MULTILABEL, columns=("a", "b", "c"))
    assert csv_cells(Task.MULTILABEL, torch.tensor([0.5, 0.49, 0.9]), multi) == ["1", "0", "1"]
    ss = LabelVocabulary(task=Task.TOKEN_CLASSIFICATION, columns=("ss",), classes=("C", "E", "H"))
    per_residue = torch.tensor([[0.1, 0.1, 0.8], [0.6, 0.3, 0.1], [0.2, 0.7, 0.1]])
    assert csv_cells(Task.TOKEN_CLASSIFICATION, per_residue, ss) == ["HCE"]
    profile = LabelVocabulary(task=Task.TOKEN_REGRESSION, columns=("p",))
    assert csv_cells(Task.TOKEN_REGRESSION, torch.tensor([0.5, 2.0, -1.0]), profile) == ["0.5 2 -1"]
