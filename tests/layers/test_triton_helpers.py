"""The launchers' host-side integer helpers agree with Triton's own (which they replace for speed)."""

import pytest

from bionemo.layers._triton import cdiv, next_power_of_2

triton = pytest.importorskip("triton")


def test_cdiv_and_next_power_of_2_equal_tritons():
    for n in [*range(0, 70), 127, 128, 129, 640, 1280, 5120, 16416, 2**31 - 1, 2**31, 2**31 + 1]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for d in (1, 2, 3, 7, 64, 528, 4096):
            assert cdiv(n, d) == triton.cdiv(n, d), (n, d)
