"""Tensor-, data- and context-parallel reductions over 2 real gloo processes, against single-process references."""

import pytest
import torch
import torch.nn.functional as F

from support.distributed import run_distributed
from support.parallel_workers import V, global_batch, ppl_worker, tp_worker

pytestmark = pytest.mark.multiprocess


def reference_loss(logits, labels, mask):
    per_token = F.cross_entropy(logits.permute(1, 2, 0), labels, reduction="none")
    return ((per_token * mask).sum() / mask.sum()).item()


def test_vocab_parallel_loss_and_gradient_match_full_vocab():
    logits, labels, mask = global_batch()
    results = run_distributed(tp_worker, 2)
    ref = reference_loss(logits, labels, mask)
    full = logits.clone().requires_grad_()
    per_token = F.cross_entropy(full.permute(1, 2, 0), labels, reduction="none")
    ((per_token * mask).sum() / mask.sum()).backward()
    for rank, result in enumerate(results):
        assert result["mean"] == pytest.approx(ref, rel=1e-5)
        torch.testing.assert_close(result["grad"], full.grad[..., rank * V // 2 : (rank + 1) * V // 2])
        # the input slice was not modified in place
        torch.testing.assert_close(result["local_input"], logits[..., rank * V // 2 : (rank + 1) * V // 2])


def _reference_ppl():
    sums, count = 0.0, 0.0
    for step in range(2):
        for micro in range(2):
            logits, labels, mask = global_batch(seed=10 * step + micro)
            sums += reference_loss(logits, labels, mask) * mask.sum().item()
            count += mask.sum().item()
    last_sum, last_count = 0.0, 0.0
    for micro in range(2):
        logits, labels, mask = global_batch(seed=10 + micro)
        last_sum += reference_loss(logits, labels, mask) * mask.sum().item()
        last_count += mask.sum().item()
    return torch.tensor(sums / count).exp().item(), torch.tensor(last_sum / last_count).exp().item()


@pytest.mark.parametrize("layout", ["dp", "cp"])
def test_perplexity_equals_exp_of_reference_mean_loss(layout):
    val_ref, train_ref = _reference_ppl()
    results = run_distributed(ppl_worker, 2, layout)
    for result in results:
        assert result["val_ppl"] == pytest.approx(val_ref, rel=1e-5)
        assert result["train_ppl"] == pytest.approx(train_ref, rel=1e-5)
