"""Pipeline stages load whole weight files by global layer names and export the whole model (2 gloo processes)."""

import pytest
import torch

from bionemo.esm2.checkpoints.weights import full_state_dict, unpadded
from bionemo.esm2.model.steps import forward_step, make_predict_step
from bionemo.lightning import ensure_model_parallel
from support.distributed import run_distributed
from support.pipeline_workers import PREDICT, pp_esm2_config, pp_weights_worker, prediction_batch

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def whole_model():
    """A one-stage model with every tensor random (layer norms too) and its weights as a file holds them."""
    ensure_model_parallel()
    torch.manual_seed(3)
    model = pp_esm2_config(1).configure_model().eval()
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn_like(param) * 0.2)
    return model, unpadded(full_state_dict(model), 33)


@pytest.fixture(scope="module")
def stages(whole_model):
    _, whole = whole_model
    return run_distributed(pp_weights_worker, 2, whole)


def test_every_stage_exports_exactly_the_whole_model_it_loaded(whole_model, stages):
    _, whole = whole_model
    assert any(name.startswith("decoder.layers.3.") for name in whole)
    for rank, stage in enumerate(stages):
        exported = unpadded(stage["full"], 33)
        assert sorted(exported) == sorted(whole), rank
        for name, value in whole.items():
            assert torch.equal(exported[name], value), (rank, name)


def test_two_stages_compute_the_logits_and_predictions_of_the_whole_model(whole_model, stages):
    model, _ = whole_model
    batch = prediction_batch()
    with torch.no_grad():
        logits = forward_step(model, batch)["token_logits"]
        predicted = make_predict_step(**PREDICT, num_layers=4)(model, batch)
    first, last = stages
    assert [first["error"], last["error"]] == [None, None], first["error"] or last["error"]
    assert [first["logits"], first["predicted"]] == [None, None]  # a first stage sends, it outputs nothing
    torch.testing.assert_close(last["logits"], logits, rtol=1e-5, atol=1e-5)
    assert sorted(last["predicted"]) == sorted(predicted)
    for key, value in predicted.items():
        torch.testing.assert_close(last["predicted"][key], value, rtol=1e-5, atol=1e-5, msg=key)
    # the prediction writer keeps the rows of the last stage only: each sample once
    assert [first["writes"], last["writes"]] == [False, True]


def test_every_stage_refuses_predictions_that_take_more_than_one_forward(stages):
    for stage in stages:
        assert stage["refused"] is not None
        assert stage["refused"].startswith("ValueError: prediction with pipeline parallelism"), stage["refused"]
        assert "perplexity need the whole model" in stage["refused"]
