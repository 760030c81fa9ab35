"""Model settings of a fine-tuning run: ``model:`` of ``--config`` on the base's shape, LoRA's recomputation."""

import pytest

from bionemo.esm2.finetune.train import LORA_RECOMPUTE_SHARE, _model_overrides, lora_recompute
from bionemo.recipes.settings import RunSettings, SettingsError

BASE = {"num_layers": 33, "hidden_size": 1280, "num_attention_heads": 20, "ffn_hidden_size": 5120, "seq_length": 1026}


def test_lora_recomputes_the_first_share_of_the_layers():
    model = lora_recompute(BASE)
    assert model["recompute_granularity"] == "full"
    assert model["recompute_method"] == "block"
    assert model["recompute_num_layers"] == round(33 * LORA_RECOMPUTE_SHARE) == 8
    assert lora_recompute({**BASE, "num_layers": 1})["recompute_num_layers"] == 1


def test_recomputation_given_in_the_config_wins():
    given = {**BASE, "recompute_granularity": "selective"}
    assert lora_recompute(given) == given


def test_config_model_settings_pass_on_the_base_shape():
    settings = RunSettings(model={"recompute_granularity": "full", "num_layers": 33})
    assert _model_overrides(settings, BASE) == {"recompute_granularity": "full", "num_layers": 33}


@pytest.mark.parametrize(("given", "fragment"), [({"hidden_size": 640}, "hidden_size=640"), ({"bogus": 1}, "bogus")])
def test_config_model_settings_that_change_the_shape_or_do_not_exist_are_refused(given, fragment):
    with pytest.raises(SettingsError, match=fragment) as error:
        _model_overrides(RunSettings(model=given), BASE)
    assert error.value.option == "--config"
