"""KeyedDropout: masks that depend on (seed, step, sample, element) only, with dropout's statistics."""

import pytest
import torch

from bionemo.layers.keyed_dropout import KeyedDropout, keyed_uniform, set_dropout_step


def test_uniforms_are_uniform_and_independent_of_each_other():
    u = keyed_uniform(torch.Size([64, 4096]), seed=3, step=5, sample_index=torch.arange(64))
    assert u.dtype == torch.float32
    assert u.min() >= 0.0
    assert u.max() < 1.0
    assert abs(u.mean().item() - 0.5) < 0.005
    assert abs(u.var().item() - 1 / 12) < 0.002
    histogram = torch.histc(u, bins=10, min=0.0, max=1.0) / u.numel()
    assert torch.allclose(histogram, torch.full((10,), 0.1), atol=0.003)
    flat = u.flatten()
    neighbours = torch.corrcoef(torch.stack([flat[:-1], flat[1:]]))[0, 1]
    samples = torch.corrcoef(torch.stack([u[:-1].flatten(), u[1:].flatten()]))[0, 1]
    assert abs(neighbours) < 0.01
    assert abs(samples) < 0.01


def test_a_samples_mask_does_not_depend_on_its_batch_or_its_padding():
    dropout = KeyedDropout(0.3, seed=7)
    dropout.step = 11
    x = torch.ones(5, 9, 4)
    together = dropout(x, torch.tensor([10, 2, 33, 4, 5]))
    alone = dropout(torch.ones(1, 9, 4), torch.tensor([33]))
    assert torch.equal(together[2:3], alone)
    longer = dropout(torch.ones(2, 15, 4), torch.tensor([2, 10]))  # padded further: positions 0-8 keep their masks
    assert torch.equal(longer[0, :9], together[1])
    assert torch.equal(longer[1, :9], together[0])


def test_masks_change_with_step_seed_and_sample():
    x = torch.ones(1, 20_000)
    dropout = KeyedDropout(0.5, seed=1)
    first = dropout(x, torch.tensor([0]))
    set_dropout_step(torch.nn.Sequential(dropout), 1)
    assert (dropout.step, dropout.seed) == (1, 1)
    set_dropout_step(torch.nn.Sequential(dropout), 1, seed=1)
    masks = [
        first,
        dropout(x, torch.tensor([0])),
        dropout(x, torch.tensor([1])),
        KeyedDropout(0.5, seed=2)(x, torch.tensor([0])),
        *(dropout(x, torch.tensor([0]), salt=salt) for salt in (1, 2, 7, 2**40)),  # any salt, even past int64 / GOLDEN
    ]
    for other in masks[1:]:
        agreement = ((first > 0) == (other > 0)).float().mean().item()
        assert abs(agreement - 0.5) < 0.02  # independent masks agree half the time at p = 0.5


@pytest.mark.parametrize("p", [0.1, 0.25])
def test_dropout_zeroes_p_and_rescales_the_rest(p):
    x = torch.randn(32, 8192, requires_grad=True)
    y = KeyedDropout(p, seed=0)(x, torch.arange(32))
    dropped = y == 0
    assert abs(dropped.float().mean().item() - p) < 0.005
    assert torch.allclose(y[~dropped], x[~dropped] / (1 - p))
    y.sum().backward()
    assert x.grad is not None
    assert torch.allclose(x.grad, (~dropped).float() / (1 - p))


def test_eval_zero_p_and_no_sample_index():
    x = torch.randn(4, 1000)
    dropout = KeyedDropout(0.2)
    assert torch.equal(dropout.eval()(x, torch.arange(4)), x)
    assert torch.equal(KeyedDropout(0.0)(x, torch.arange(4)), x)
    plain = dropout.train()(x)  # torch's own dropout: the process's random stream
    assert abs((plain == 0).float().mean().item() - 0.2) < 0.03
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        KeyedDropout(1.0)
