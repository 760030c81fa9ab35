"""TokenWeightedSums against plain sums of the pairs: one rank, empty epochs, dtypes, devices and gloo ranks."""

import pytest
import torch

from bionemo.losses import TokenWeightedSums
from support.distributed import run_distributed
from support.token_sums_worker import loss_pairs, two_groups_worker


def test_sum_and_mean_over_several_steps_match_a_plain_reference():
    steps = [loss_pairs(seed) for seed in range(3)]
    sums = TokenWeightedSums()
    for pairs in steps:
        sums.add(pairs)
    flat = [pair for pairs in steps for pair in pairs]
    loss_sum = sum(float(p[0]) for p in flat)
    num_tokens = sum(float(p[1]) for p in flat)
    torch.testing.assert_close(sums.reduce(), torch.tensor([loss_sum, num_tokens]))
    mean = sums.mean()
    assert mean is not None
    assert float(mean) == pytest.approx(loss_sum / num_tokens, rel=1e-6)
    per_batch = [float(p[0] / p[1]) for p in flat if p[1] > 0]
    assert float(mean) != pytest.approx(sum(per_batch) / len(per_batch), rel=1e-3)  # not a mean of means


def test_an_empty_epoch_reduces_to_zeros_and_has_no_mean():
    sums = TokenWeightedSums()
    assert sums.empty
    torch.testing.assert_close(sums.reduce(), torch.zeros(2))
    assert sums.mean() is None
    sums.add([])
    assert sums.empty
    sums.add([torch.tensor([0.0, 0.0])])  # pairs, but no token
    assert not sums.empty
    assert sums.mean() is None


def test_reset_forgets_and_reduce_leaves_the_running_sum_alone():
    sums = TokenWeightedSums()
    sums.add([torch.tensor([6.0, 3.0])])
    result = sums.reduce()
    result.zero_()  # the result is a copy
    torch.testing.assert_close(sums.reduce(), torch.tensor([6.0, 3.0]))
    sums.reset()
    assert sums.empty
    sums.add([torch.tensor([1.0, 4.0])])
    assert float(sums.mean()) == pytest.approx(0.25)  # type: ignore[arg-type]


def test_pairs_of_any_float_dtype_sum_in_fp32_without_gradient():
    loss = torch.tensor(2.5, requires_grad=True)
    pairs = [
        torch.stack([loss * 2, torch.tensor(4.0)]),
        torch.tensor([1.0, 2.0], dtype=torch.bfloat16),
        torch.tensor([0.5, 1.0], dtype=torch.float64),
    ]
    sums = TokenWeightedSums()
    sums.add(pairs)
    result = sums.reduce()
    assert result.dtype == torch.float32
    assert not result.requires_grad
    torch.testing.assert_close(result, torch.tensor([6.5, 7.0]))


def test_a_pair_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=r"shape \(2,\); got \(3,\)"):
        TokenWeightedSums().add([torch.zeros(3)])


def test_the_result_lives_on_the_requested_device():
    sums = TokenWeightedSums()
    assert sums.reduce(device="meta").device.type == "meta"
    sums.add([torch.tensor([1.0, 2.0])])
    assert sums.reduce(device="meta").device.type == "meta"
    assert sums.reduce().device.type == "cpu"


@pytest.mark.gpu
def test_pairs_on_different_devices_sum_on_the_first_ones_device():
    sums = TokenWeightedSums()
    sums.add([torch.tensor([1.0, 2.0], device="cuda"), torch.tensor([3.0, 4.0])])
    sums.add([torch.tensor([5.0, 6.0])])
    assert sums.reduce().device.type == "cuda"
    torch.testing.assert_close(sums.reduce(device="cpu"), torch.tensor([9.0, 12.0]))


@pytest.mark.multiprocess
def test_reduce_sums_over_every_rank_of_each_group_in_turn():
    pairs = loss_pairs(seed=7)
    local = torch.stack(pairs).sum(dim=0)
    for result in run_distributed(two_groups_worker, 2):
        torch.testing.assert_close(result["sums"], 2 * local)  # rank 0's pairs, once per group
        assert result["mean"] is not None
        assert float(result["mean"]) == pytest.approx(float(local[0] / local[1]), rel=1e-6)
