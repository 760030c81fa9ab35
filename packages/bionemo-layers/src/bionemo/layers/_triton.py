"""Whether Triton can be imported, and the host-side integer helpers of this package's Triton launchers.

The GPU kernels of this package use Triton when it is there (it is optional). ``triton.cdiv`` and
``triton.next_power_of_2`` are Triton ``constexpr_function`` objects (triton 3.9): usable in kernels, but each host
call first unwraps its arguments, which costs many times the plain integer arithmetic here, on every kernel launch
(docs/benchmarks.md#host-time-per-kernel-call).
"""

import functools

__all__ = ["cdiv", "next_power_of_2", "triton_importable"]


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints (``triton.cdiv`` without its constexpr wrapper)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` (0 for 0), as ``triton.next_power_of_2``, without its wrapper."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


@functools.cache
def triton_importable() -> bool:
    """``import triton`` succeeds (asked once per process)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
