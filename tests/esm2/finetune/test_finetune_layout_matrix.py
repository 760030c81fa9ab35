"""The fine-tuning layout matrix: the same global batch fine-tunes the same tiny ESM-2 on 1 process, DP 2 and TP 2.

Two cases (:mod:`support.layout_matrix_finetune`): classification with a mean-mlp head training the whole encoder,
and token-classification with a mask and a conv-token head training LoRA adapters, whose step loss is weighted by
scored residues. Each layout is compared with one process: the per-step training loss, the validation loss and the
exported whole tensors (encoder, LoRA factors, head). Fine-tuning refuses pipeline and context parallelism, so
those layouts are not in the matrix.
"""

import types

import pytest
import torch

from support.distributed import run_distributed
from support.layout_matrix import STEPS
from support.layout_matrix_finetune import (
    CASES,
    LAYOUTS,
    UNPADDED,
    finetune_config,
    layouts_worker,
    one_process,
    start_weights,
)

pytestmark = pytest.mark.multiprocess

REL = 2e-4
"""Losses of a layout against one process."""

OUTPUT_LAYER = {"classification": "head.out_proj.weight", "token-classification": "head.classifier.weight"}


@pytest.fixture(scope="module")
def starts() -> dict[str, dict[str, torch.Tensor]]:
    return start_weights()


@pytest.fixture(scope="module")
def single(starts):
    return one_process(starts)


@pytest.fixture(scope="module")
def layouts(starts):
    return run_distributed(layouts_worker, 2, starts)


@pytest.mark.parametrize("case", CASES)
def test_one_process_learns(case, single, starts):
    result = single[case]
    assert len(result["losses"]) == STEPS
    assert result["losses"][-1] < 0.9 * result["losses"][0]
    head = OUTPUT_LAYER[case]
    assert (result["weights"][head] - starts[case][head]).abs().max() > 1e-3


def test_lora_trains_adapters_and_leaves_the_base_weights(single, starts):
    weights, start = single["token-classification"]["weights"], starts["token-classification"]
    factors = sorted(name for name in weights if ".lora_" in name)
    assert len(factors) == 2 * 4 * 4  # A and B of qkv, proj, fc1 and fc2 in each of the 4 layers
    assert sorted(set(weights) - set(factors)) == sorted(start)
    for name in factors:
        if name.endswith("lora_B.weight"):
            assert weights[name].abs().max() > 0, name  # B starts at zeros
    for name, value in start.items():
        if not name.startswith("head."):
            assert torch.equal(weights[name], value), name


def test_token_loss_is_residue_weighted(single):
    """The step loss is the sum over scored residues / their count; a mean of micro-batch means is another number."""
    result = single["token-classification"]
    for step, pairs in enumerate(result["micro_losses"]):
        pairs = torch.tensor(pairs, dtype=torch.float64)  # [micro-batches, 2]: loss sum, scored residues
        assert len(pairs) == 4
        assert len(set(pairs[:, 1].tolist())) > 1, "the micro-batches must score unlike numbers of residues"
        weighted = float(pairs[:, 0].sum() / pairs[:, 1].sum())
        mean_of_means = float((pairs[:, 0] / pairs[:, 1]).mean())
        assert result["losses"][step] == pytest.approx(weighted, rel=1e-6)
        assert abs(mean_of_means - weighted) > 5 * REL * weighted, step  # well outside the layouts' tolerance


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS) + [f"{name}-unpadded" for name in UNPADDED])
def test_layout_finetunes_as_one_process(layout, case, single, layouts):
    """``<layout>-unpadded``: padded batches on their real tokens, as GPUs run them, against one process padded."""
    expected = single[case]
    for by_layout in layouts:
        assert (by_layout[layout]["unpadded"] > 0) == layout.endswith("-unpadded")  # the path under test ran
    for rank, by_layout in enumerate(layouts):
        result = by_layout[layout][case]
        assert result["losses"] == pytest.approx(expected["losses"], rel=REL), rank
        assert result["val_loss"] == pytest.approx(expected["val_loss"], rel=REL), rank
        weights = result["weights"]
        assert weights.keys() == expected["weights"].keys(), rank
        for name, value in expected["weights"].items():
            assert weights[name].shape == value.shape, (rank, name)
            assert (weights[name] - value).abs().mean() < 1e-5, (rank, name)


def test_megatron_strategy_trains_the_residue_weighted_loss():
    """What the stand-in assumes of megatron (``calculate_per_token_loss``) NeMo's strategy sets for fine-tuning."""
    from bionemo.lightning._nemo.step_runner import MegatronStepRunner

    config = finetune_config("token-classification")
    assert not config.calculate_per_token_loss
    module = types.SimpleNamespace(
        optim=object(), config=config, loss_reduction_class=config.get_loss_reduction_class()
    )
    MegatronStepRunner().prepare_model(module)  # type: ignore[arg-type]
    assert config.calculate_per_token_loss
