import pytest
import torch

from bionemo.losses import PassthroughLossReduction


@pytest.mark.parametrize(
    "output",
    [
        torch.randn(2, 3),
        {"token_logits": torch.randn(4, 2, 5), "embeddings": torch.randn(2, 8)},
        (torch.randn(2, 1), torch.randn(2, 2)),
        [torch.randn(2, 1, dtype=torch.float64)],
    ],
    ids=["tensor", "dict", "tuple", "list"],
)
def test_forward_returns_zero_loss_and_output_unchanged(output):
    loss, passed = PassthroughLossReduction().forward({"ignored": torch.zeros(1)}, output)
    assert passed is output
    assert loss.shape == (1,)
    assert loss.item() == 0
    first = (
        output
        if isinstance(output, torch.Tensor)
        else next(iter(output.values() if isinstance(output, dict) else output))
    )
    assert loss.dtype == first.dtype


def test_reduce_collates_micro_batches():
    reduction = PassthroughLossReduction()
    a = {"token_logits": torch.randn(4, 2, 5), "sample_index": torch.tensor([0, 1])}
    b = {"token_logits": torch.randn(6, 1, 5), "sample_index": torch.tensor([2])}
    out = reduction.reduce([reduction.forward(None, a)[1], reduction.forward(None, b)[1]])
    assert out["token_logits"].shape == (6, 3, 5)
    torch.testing.assert_close(out["token_logits"][:4, :2], a["token_logits"])
    torch.testing.assert_close(out["token_logits"][:, 2:], b["token_logits"])
    assert out["token_logits"][4:, :2].eq(0).all()
    assert out["sample_index"].tolist() == [0, 1, 2]


def test_empty_micro_batches_reduce_to_none():
    reduction = PassthroughLossReduction()
    loss, out = reduction.forward(None, None)
    assert out is None
    assert loss.item() == 0
    assert reduction.reduce([None, None]) is None
    kept = reduction.reduce([None, {"x": torch.ones(1, 2)}])
    assert kept["x"].shape == (1, 2)


def test_megatron_calling_convention_setup_then_call():
    """MegatronStrategy calls setup(batch) then reduction(forward_out); the pre-hook supplies the batch."""
    reduction = PassthroughLossReduction()
    out = {"x": torch.ones(2, 2)}
    reduction.setup({"tokens": torch.zeros(2, 2)})
    loss, passed = reduction(out)
    assert passed is out
    assert loss.item() == 0
