"""``ESM_DEFAULTS`` (read by the torch-free checkpoint check) are ``ESM2Config``'s field defaults."""

import dataclasses

from bionemo.esm2.checkpoints.header import ESM_DEFAULTS
from bionemo.esm2.model import ESM2Config


def test_esm_defaults_are_the_config_defaults():
    defaults = {field.name: field.default for field in dataclasses.fields(ESM2Config)}
    assert {name: defaults[name] for name in ESM_DEFAULTS} == ESM_DEFAULTS
