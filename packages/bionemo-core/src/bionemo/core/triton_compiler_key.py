"""Triton's compiler key, computed in a background thread before the first kernel launch needs it.

A process's first Triton kernel launch looks its compiled kernel up under a key that includes a SHA-256 of Triton's
whole shared library (``triton.runtime.cache.triton_key``: ``libtriton``, ~500 MB in triton 3.x), computed once per
process: a third to half a second even when every kernel is already in Triton's disk cache. Reading and hashing
release the GIL, so a command that will launch Triton kernels (prediction on a GPU) starts it early and sets up
meanwhile. Standard library only until the thread runs (the CLI imports this before torch).
"""

import importlib.util
import threading

__all__ = ["prefetch_triton_compiler_key"]


def _compute() -> None:
    try:
        from triton.runtime.cache import triton_key

        triton_key()
    except Exception:  # noqa: BLE001, S110 - the first kernel launch computes it again, and raises there
        pass


def prefetch_triton_compiler_key() -> threading.Thread | None:
    """Start a daemon thread computing ``triton_key()`` (cached for the process); the thread, None without Triton.

    Touches no GPU and changes nothing but Triton's in-process cache, so it is safe on every rank. A launch that
    comes before the thread is done computes the key itself (the same value).
    """
    if importlib.util.find_spec("triton") is None:
        return None
    thread = threading.Thread(target=_compute, name="triton-compiler-key", daemon=True)
    thread.start()
    return thread
