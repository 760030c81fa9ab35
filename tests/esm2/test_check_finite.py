"""check_finite (bionemo.esm2.hf.files) refuses exactly the tensors that hold a NaN or an Inf."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bionemo.esm2.hf.files import CheckpointError, check_finite

SPECIAL = [float("nan"), float("inf"), -float("inf")]


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(allow_nan=False, allow_infinity=False, width=16), max_size=70),
    specials=st.lists(st.tuples(st.integers(0, 69), st.sampled_from(SPECIAL)), max_size=3),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]),
    rows=st.sampled_from([1, 2]),
)
def test_refuses_exactly_what_isfinite_refuses(values, specials, dtype, rows):
    tensor = torch.tensor(values * rows, dtype=dtype)
    for position, special in specials:
        if position < tensor.numel():
            tensor[position] = special
    if rows == 2 and tensor.numel():
        tensor = tensor.reshape(2, -1).t()  # not contiguous
    reference_ok = bool(torch.isfinite(tensor).all())
    if reference_ok:
        check_finite("w", tensor)
    else:
        with pytest.raises(CheckpointError, match="tensor w holds NaN or Inf values"):
            check_finite("w", tensor)


def test_integer_and_empty_tensors_pass():
    check_finite("ids", torch.arange(5))
    check_finite("empty", torch.empty(0, 3))
