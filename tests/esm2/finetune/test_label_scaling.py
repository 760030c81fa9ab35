"""Regression heads learn standardized labels and export in the labels' units (bionemo.esm2.finetune.label_scaling)."""

import statistics

import pytest
import torch

from bionemo.esm2.finetune.head_config import HeadKind
from bionemo.esm2.finetune.heads import ConvTokenHead, HFSequenceHead, MeanPoolMLPHead
from bionemo.esm2.finetune.label_scaling import LabelScaling
from bionemo.esm2.finetune.tasks import LabelledRecord, Task


def test_regression_columns_get_their_mean_and_population_sd():
    records = [LabelledRecord(id=f"r{i}", sequence="MKV", labels=(40.0 + i, 0.5 * i, 7.0)) for i in range(5)]
    scaling = LabelScaling.from_records(Task.REGRESSION, records)
    assert scaling is not None
    columns = list(zip(*(r.labels for r in records), strict=True))
    assert scaling.center == pytest.approx([statistics.fmean(c) for c in columns])
    assert scaling.scale[:2] == pytest.approx([statistics.pstdev(c) for c in columns[:2]])
    assert scaling.scale[2] == 1.0  # a constant column is only shifted
    assert LabelScaling.from_json(scaling.to_json()) == scaling
    assert LabelScaling.from_json("null") is None
    assert LabelScaling.from_records(Task.CLASSIFICATION, [LabelledRecord("a", "MK", ("x",))]) is None


def test_token_regression_pools_the_scored_residues():
    records = [
        LabelledRecord("a", "MKV", (1.0, 2.0, 100.0), mask=(True, True, False)),  # 100 is not scored
        LabelledRecord("b", "MK", (3.0, 4.0)),
    ]
    scaling = LabelScaling.from_records(Task.TOKEN_REGRESSION, records)
    assert scaling is not None
    assert scaling.center == pytest.approx([2.5])
    assert scaling.scale == pytest.approx([statistics.pstdev([1.0, 2.0, 3.0, 4.0])])


def test_outputs_are_scaled_in_float32():
    scaling = LabelScaling((44.0, -1.0), (3.0, 0.5))
    raw = torch.tensor([[0.0, 0.0], [1.0, 2.0]], dtype=torch.bfloat16)
    scaled = scaling.apply(raw)
    assert scaled.dtype == torch.float32
    torch.testing.assert_close(scaled, torch.tensor([[44.0, -1.0], [47.0, 0.0]]))
    fine = scaling.apply(torch.tensor([[0.00390625, 0.0]], dtype=torch.bfloat16))  # bf16 cannot hold 44.01171875
    assert fine[0, 0].item() == 44.01171875


@pytest.mark.parametrize(
    ("kind", "head"),
    [
        (HeadKind.HF_SEQUENCE, HFSequenceHead(16, 2, dropout=0.0)),
        (HeadKind.MEAN_MLP, MeanPoolMLPHead(16, 2, 8, dropout=0.0)),
        (HeadKind.CONV_TOKEN, ConvTokenHead(16, 2, 4, 3, dropout=0.0)),
    ],
)
def test_folding_into_the_last_layer_gives_the_scaled_outputs(kind, head):
    torch.manual_seed(0)
    scaling = LabelScaling((44.0, -3.0), (3.0, 0.25))
    hidden, mask = torch.randn(3, 5, 16), torch.ones(3, 5, dtype=torch.bool)
    expected = scaling.apply(head(hidden, mask))
    state = {f"head.{name}": value for name, value in head.state_dict().items()}
    folded = scaling.fold(state, kind)
    assert folded.keys() == state.keys()
    head.load_state_dict({name.removeprefix("head."): value for name, value in folded.items()})
    torch.testing.assert_close(head(hidden, mask), expected, rtol=1e-5, atol=1e-5)


def test_the_loss_is_the_squared_error_of_standardized_labels():
    from bionemo.esm2.finetune.objectives import loss_sum
    from bionemo.esm2.finetune.reduction import FinetuneLossReduction
    from bionemo.losses import ParallelGroups

    scaling = LabelScaling((44.0, 0.0), (3.0, 0.01))
    logits, target = torch.tensor([[47.0, 0.02], [41.0, -0.01]]), torch.tensor([[44.0, 0.0], [44.0, 0.0]])
    expected = (((logits - target) / torch.tensor([3.0, 0.01])) ** 2).mean(dim=-1).sum()  # both columns weigh alike
    total, count = loss_sum(Task.REGRESSION, logits, target, scale=scaling.on(logits.device)[0])
    torch.testing.assert_close(total, expected)
    assert int(count) == 2
    reduction = FinetuneLossReduction(groups=ParallelGroups(), task=Task.REGRESSION, label_scaling=scaling)
    batch = {"target": target, "target_mask": torch.ones(2, dtype=torch.bool)}
    torch.testing.assert_close(reduction.forward(batch, logits)[0], expected)
    unscaled = loss_sum(Task.REGRESSION, logits, target).total  # without a scaling: the labels' units
    torch.testing.assert_close(unscaled, ((logits - target) ** 2).mean(dim=-1).sum())
    token = loss_sum(Task.TOKEN_REGRESSION, torch.tensor([[47.0, 50.0]]), torch.tensor([[44.0, 44.0]]),
                     torch.tensor([[True, False]]), scale=torch.tensor([3.0]))  # fmt: skip
    torch.testing.assert_close(token.total, torch.tensor(1.0))
