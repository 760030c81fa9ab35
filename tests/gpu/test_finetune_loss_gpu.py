"""The fine-tuning losses on a GPU: the CPU's values, and no host-device synchronisation in forward or backward."""

import pytest
import torch

from bionemo.esm2.finetune.objectives import loss_sum
from bionemo.esm2.finetune.tasks import Task

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("task", list(Task))
def test_loss_sum_matches_the_cpu_without_making_the_host_wait(task):
    torch.manual_seed(0)
    per_residue = task.per_residue
    shape = (4, 12) if per_residue else (4,)
    mask = torch.rand(shape) > 0.3
    width = 1 if task in (Task.TOKEN_REGRESSION,) else 3
    logits = torch.randn(*shape, width)
    if task in (Task.CLASSIFICATION, Task.TOKEN_CLASSIFICATION):
        target = torch.randint(0, 3, shape)
    elif task is Task.MULTILABEL:
        target = torch.randint(0, 2, (*shape, 3)).float()
    elif task is Task.REGRESSION:
        target = torch.randn(*shape, 3)
    else:
        target = torch.randn(shape)
    # class weights (--class-weights) for the classification tasks, label scales for the regression tasks
    weights = torch.tensor([0.5, 2.0, 1.25]) if task in (Task.CLASSIFICATION, Task.TOKEN_CLASSIFICATION) else None
    if task is Task.MULTILABEL:
        weights = torch.tensor([[0.5, 1.0, 0.75], [3.0, 1.0, 1.5]])  # each label's 0s, 1s
    scale = torch.tensor([2.0, 0.5, 1.0][:width]) if task in (Task.REGRESSION, Task.TOKEN_REGRESSION) else None
    expected = loss_sum(task, logits, target, mask, scale, weights)
    on_gpu = logits.cuda().requires_grad_()
    gpu_target, gpu_mask = target.cuda(), mask.cuda()
    gpu_scale = None if scale is None else scale.cuda()
    gpu_weights = None if weights is None else weights.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        total, count = loss_sum(task, on_gpu, gpu_target, gpu_mask, gpu_scale, gpu_weights)
        total.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(total.cpu(), expected.total)
    assert count.item() == expected.num_items.item()
