"""Imports written before the model building blocks moved to ``bionemo.layers`` still work, with the same objects."""

import importlib

import pytest

import bionemo.layers
import bionemo.lightning

MOVED = ["context_parallel", "fused_bias_linear", "layer_norm", "rotary", "sdpa_attention"]
"""``bionemo.lightning.<module>`` paths that re-export ``bionemo.layers.<module>``."""


@pytest.mark.parametrize("module", MOVED)
def test_old_module_paths_serve_the_new_modules_objects(module):
    old = importlib.import_module(f"bionemo.lightning.{module}")
    new = importlib.import_module(f"bionemo.layers.{module}")
    assert set(new.__all__) <= set(old.__all__)
    assert {name: getattr(old, name) for name in old.__all__} == {name: getattr(new, name) for name in old.__all__}


def test_the_lightning_package_still_exports_the_attention_blocks():
    names = ["RotarySelfAttention", "SDPACoreAttention", "UnpaddedSequences", "sdpa_layer_spec"]
    names.append("varlen_attention_available")
    assert set(names) <= set(bionemo.lightning.__all__)
    assert all(getattr(bionemo.lightning, name) is getattr(bionemo.layers, name) for name in names)
