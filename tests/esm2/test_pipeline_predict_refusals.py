"""What pipeline-parallel prediction cannot do is refused before start-up, naming why and what to give instead."""

import pytest

from bionemo.esm2.recipes.predict import _check_pipeline_outputs
from bionemo.recipes.settings import Include, RunSettings, SettingsError


def pp2(**given) -> RunSettings:
    return RunSettings(devices=2, pipeline_parallel=2, strategy="megatron", **given)


def test_embeddings_and_logits_of_the_last_layer_pass():
    _check_pipeline_outputs(pp2(include=[Include.EMBEDDINGS, Include.LOGITS]), [4], num_layers=4)
    _check_pipeline_outputs(RunSettings(), [1], num_layers=4)  # no pipeline: anything goes


@pytest.mark.parametrize(
    ("settings", "layers", "option", "message"),
    [
        (pp2(), [], "--include", "not perplexity (perplexities need more than one forward pass"),
        (pp2(include=[Include.PSEUDO_PERPLEXITY]), [], "--include", "not pseudo-perplexity"),
        (pp2(include=[Include.EMBEDDINGS]), [2, 4], "--layer", "outputs the last layer only, not --layer 2"),
        (
            RunSettings(devices=4, pipeline_parallel=2, strategy="megatron", include=[Include.EMBEDDINGS]),
            [],
            "--devices",
            "one model replica: give --devices x --num-nodes = tensor x pipeline x context parallel = 2",
        ),
    ],
)
def test_refused(settings, layers, option, message):
    with pytest.raises(SettingsError, match="--pipeline-parallel 2") as refused:
        _check_pipeline_outputs(settings, layers, num_layers=4)
    assert refused.value.option == option
    assert message in str(refused.value)
