"""FinetuneLossReduction: per-task losses against plain torch means, validation outputs, item-weighted reduce."""

import pytest
import torch
import torch.nn.functional as F

from bionemo.esm2.finetune.objectives import loss_sum
from bionemo.esm2.finetune.reduction import OUTPUT_KEYS, FinetuneLossReduction
from bionemo.esm2.finetune.tasks import Task
from bionemo.losses import LOSS_SUM_KEY, ParallelGroups

ONE_PROCESS = ParallelGroups()


def _case(task: Task, b: int, s: int = 7, k: int = 3, seed: int = 0):
    """``(logits, batch, plain torch mean loss)``; masked-out targets hold values that would break the loss."""
    gen = torch.Generator().manual_seed(seed)
    if task is Task.CLASSIFICATION:
        logits, target = torch.randn(b, k, generator=gen).requires_grad_(), torch.randint(k, (b,), generator=gen)
        mask, expected = torch.ones(b, dtype=torch.bool), F.cross_entropy(logits, target)
    elif task is Task.MULTILABEL:
        logits, target = (
            torch.randn(b, k, generator=gen).requires_grad_(),
            torch.randint(2, (b, k), generator=gen).float(),
        )
        mask, expected = torch.ones(b, dtype=torch.bool), F.binary_cross_entropy_with_logits(logits, target)
    elif task is Task.REGRESSION:
        logits, target = torch.randn(b, k, generator=gen).requires_grad_(), torch.randn(b, k, generator=gen)
        mask, expected = torch.ones(b, dtype=torch.bool), F.mse_loss(logits, target)
    else:
        mask = torch.rand(b, s, generator=gen) < 0.6
        mask[:, 0] = False  # <cls> is never scored
        mask[0, 1] = True  # at least one scored residue
        if task is Task.TOKEN_CLASSIFICATION:
            logits, target = (
                torch.randn(b, s, k, generator=gen).requires_grad_(),
                torch.randint(k, (b, s), generator=gen),
            )
            expected = F.cross_entropy(logits[mask], target[mask])
            target = target.masked_fill(~mask, -7)  # not a class: must be ignored
        else:
            logits, target = torch.randn(b, s, 1, generator=gen).requires_grad_(), torch.randn(b, s, generator=gen)
            expected = F.mse_loss(logits[..., 0][mask], target[mask])
            target = target.masked_fill(~mask, float("nan"))
    return logits, {"target": target, "target_mask": mask}, expected


@pytest.mark.parametrize("task", list(Task))
def test_forward_is_loss_sum_and_reduce_is_the_plain_mean(task):
    logits, batch, expected = _case(task, b=5)
    reduction = FinetuneLossReduction(groups=ONE_PROCESS, task=task)
    total, count, reduced = reduction.forward(batch, {"logits": logits})
    reference = loss_sum(task, logits, batch["target"], batch["target_mask"])
    torch.testing.assert_close(total, reference.total)
    assert count.dtype == torch.int
    assert int(count) == int(reference.num_items) == int(batch["target_mask"].sum())
    assert set(reduced) == {LOSS_SUM_KEY}  # training outputs carry the pair only
    torch.testing.assert_close(reduced[LOSS_SUM_KEY], torch.stack([total.detach(), count.float()]))
    torch.testing.assert_close(reduction.reduce([reduced]), expected.detach())
    torch.testing.assert_close(total / count, expected)
    # the gradient megatron / Lightning take (sum over the count) is the plain mean's
    (grad,) = torch.autograd.grad(total / count, logits)
    (expected_grad,) = torch.autograd.grad(expected, logits)
    torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize("task", list(Task))
def test_a_bare_tensor_output_is_the_logits(task):
    logits, batch, expected = _case(task, b=3)
    reduction = FinetuneLossReduction(groups=ONE_PROCESS, task=task)
    _, _, reduced = reduction.forward(batch, logits)
    torch.testing.assert_close(reduction.reduce([reduced]), expected.detach())


@pytest.mark.parametrize("task", list(Task))
def test_validation_outputs_carry_detached_logits_target_and_mask(task):
    logits, batch, expected = _case(task, b=4)
    reduction = FinetuneLossReduction(validation_step=True, groups=ONE_PROCESS, task=task)
    total, count, reduced = reduction.forward(batch, {"logits": logits})
    assert not total.requires_grad
    assert set(reduced) == {LOSS_SUM_KEY, *OUTPUT_KEYS}
    assert not reduced["logits"].requires_grad
    torch.testing.assert_close(reduced["logits"], logits.detach())
    assert reduced["target"] is batch["target"]
    assert reduced["target_mask"] is batch["target_mask"]
    torch.testing.assert_close(reduction.reduce([reduced]), expected.detach())


@pytest.mark.parametrize("task", [Task.TOKEN_CLASSIFICATION, Task.TOKEN_REGRESSION])
def test_token_tasks_weight_micro_batches_by_scored_residues(task):
    """Two micro-batches of different sizes and lengths: the mean over every scored residue, not the mean of means."""
    first, second = _case(task, b=1, s=5, seed=1), _case(task, b=6, s=11, seed=2)
    reduction = FinetuneLossReduction(groups=ONE_PROCESS, task=task)
    outs = [reduction.forward(batch, logits)[2] for logits, batch, _ in (first, second)]

    def flat(logits, batch):
        keep = batch["target_mask"]
        scores = logits.detach()[keep] if task is Task.TOKEN_CLASSIFICATION else logits.detach()[..., 0][keep]
        return scores, batch["target"][keep]

    (s1, t1), (s2, t2) = flat(*first[:2]), flat(*second[:2])
    scores, truth = torch.cat([s1, s2]), torch.cat([t1, t2])
    overall = F.cross_entropy(scores, truth) if task is Task.TOKEN_CLASSIFICATION else F.mse_loss(scores, truth)
    mean_of_means = (first[2] + second[2]).detach() / 2
    assert len(t1) != len(t2)
    assert not torch.isclose(overall, mean_of_means, rtol=1e-3)  # the two weightings differ on this data
    torch.testing.assert_close(reduction.reduce(outs), overall)


@pytest.mark.parametrize("task", [Task.CLASSIFICATION, Task.MULTILABEL, Task.REGRESSION])
def test_sequence_tasks_weight_micro_batches_by_sequences(task):
    first, second = _case(task, b=2, seed=3), _case(task, b=7, seed=4)
    reduction = FinetuneLossReduction(groups=ONE_PROCESS, task=task)
    outs = [reduction.forward(batch, logits)[2] for logits, batch, _ in (first, second)]
    overall = (2 * first[2] + 7 * second[2]).detach() / 9
    torch.testing.assert_close(reduction.reduce(outs), overall)


def test_a_batch_without_targets_is_refused_naming_the_key():
    reduction = FinetuneLossReduction(groups=ONE_PROCESS, task=Task.CLASSIFICATION)
    with pytest.raises(KeyError, match="target_mask"):
        reduction.forward({"target": torch.zeros(2, dtype=torch.long)}, torch.zeros(2, 3))


def test_the_task_is_checked():
    with pytest.raises(ValueError, match="not-a-task"):
        FinetuneLossReduction(task="not-a-task")  # type: ignore[arg-type]
