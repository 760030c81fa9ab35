import pytest
import torch

from bionemo.core import get_dtype_device, some_first


def test_some_first_returns_first_non_none():
    assert some_first([None, 0, 1]) == 0
    assert some_first(iter([None, None, "x"])) == "x"


@pytest.mark.parametrize("seq", [[], [None], (None, None)])
def test_some_first_raises_without_value(seq):
    with pytest.raises(ValueError, match="non-None value not found"):
        some_first(seq)


def test_get_dtype_device_tensor_and_module():
    assert get_dtype_device(torch.zeros(2, dtype=torch.float16)) == (torch.float16, torch.device("cpu"))
    module = torch.nn.Linear(2, 2).to(torch.float64)
    assert get_dtype_device(module) == (torch.float64, torch.device("cpu"))


def test_get_dtype_device_containers_use_first_non_none():
    nested = {"a": None, "b": [None, torch.zeros(1, dtype=torch.int8)]}
    assert get_dtype_device(nested) == (torch.int8, torch.device("cpu"))
    assert get_dtype_device((torch.ones(1, dtype=torch.bfloat16),)) == (torch.bfloat16, torch.device("cpu"))


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([], "Looking up dtype on an empty list"),
        ({}, "Looking up dtype on an empty dict"),
        ([None], "non-None value not found"),
        ({"a": None}, "non-None value not found"),
        (torch.nn.ReLU(), "Cannot get dtype on a torch module with no parameters."),
    ],
)
def test_get_dtype_device_value_errors_are_bionemo_llms_word_for_word(obj, message):
    import re

    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        get_dtype_device(obj)


@pytest.mark.parametrize("obj", [1, 1.5, "abc", object()])
def test_get_dtype_device_type_errors(obj):
    with pytest.raises(TypeError, match="^Got something we didnt expect$"):
        get_dtype_device(obj)
