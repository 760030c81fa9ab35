"""Whether Triton can be imported (optional: the GPU kernels of this package use it when it is there)."""

import functools

__all__ = ["triton_importable"]


@functools.cache
def triton_importable() -> bool:
    """``import triton`` succeeds (asked once per process)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
