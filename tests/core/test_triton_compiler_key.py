"""prefetch_triton_compiler_key: Triton's compiler key is computed in a thread and cached for the process."""

import subprocess
import sys

import pytest

CHILD = """
import sys, threading
from bionemo.core.triton_compiler_key import prefetch_triton_compiler_key
thread = prefetch_triton_compiler_key()
assert "torch" not in sys.modules, "imported torch"
assert thread is not None and thread.daemon and thread is not threading.current_thread()
thread.join()
from triton.runtime.cache import triton_key
assert triton_key.cache_info().currsize == 1, triton_key.cache_info()
assert triton_key() and triton_key.cache_info().hits == 1, triton_key.cache_info()
"""


def test_the_thread_fills_tritons_key_cache_without_importing_torch():
    pytest.importorskip("triton")
    result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def test_no_thread_without_triton(monkeypatch: pytest.MonkeyPatch):
    import importlib.util

    from bionemo.core import triton_compiler_key

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert triton_compiler_key.prefetch_triton_compiler_key() is None
