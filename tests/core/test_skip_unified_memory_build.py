"""megatron-core's unified-memory extension is not built at import (bionemo.core.skip_unified_memory_build)."""

import importlib.metadata
import os
import subprocess
import sys
import warnings

import pytest

import bionemo.core.module_hook as module_hook
import bionemo.core.skip_unified_memory_build as skip
from bionemo.core.skip_unified_memory_build import (
    MODULE,
    SWITCH,
    UPSTREAM_SHA256,
    VERIFIED_MEGATRON_CORE,
    UnverifiedMegatronWarning,
    skip_unified_memory_build,
    upstream_sha256,
)

# A clean process: torch's load_inline counts its calls (and refuses, as a failed build does), then megatron is
# imported after `arm` ran; prints the calls, megatron's flag, what is left patched and megatron's warnings.
CHILD = """
import sys, warnings
import torch.utils.cpp_extension as cpp
calls = []
def counting(*args, **kwargs):
    calls.append(kwargs.get("name"))
    raise ImportError("no build in this test")
cpp.load_inline = counting
from bionemo.core.module_hook import module_hooked
from bionemo.core.skip_unified_memory_build import MODULE, skip_unified_memory_build
armed = skip_unified_memory_build()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import megatron.core.inference.unified_memory as um
left = [MODULE] if module_hooked(MODULE) else []
print(armed, len(calls), um.has_unified_memory, cpp.load_inline is counting, um.load_inline is counting, len(left),
      sum("unified memory mempool" in str(w.message) for w in caught))
"""


def run_child(switch: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != SWITCH}
    if switch is not None:
        env[SWITCH] = switch
    result = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split()


def test_canary_the_installed_upstream_file_is_the_verified_one():
    """Fails when megatron-core changes: re-verify the work-around (or drop it) and update the digest."""
    assert importlib.metadata.version("megatron-core").split("+")[0] == VERIFIED_MEGATRON_CORE
    assert upstream_sha256() == UPSTREAM_SHA256


def test_megatron_imports_without_building_and_nothing_stays_patched():
    armed, calls, has_unified_memory, torch_restored, module_restored, finders_left, warned = run_child(None)
    assert armed == "True"
    assert calls == "0"  # torch's load_inline was never called: no compiler ran
    assert has_unified_memory == "False"  # megatron's own fallback
    assert (torch_restored, module_restored, finders_left) == ("True", "True", "0")
    assert warned == "0"  # megatron's "Failed to create unified memory mempool." is not shown


def test_switched_off_megatron_builds_as_upstream_does():
    armed, calls, has_unified_memory, _, _, _, warned = run_child("1")
    assert (armed, calls, has_unified_memory, warned) == ("False", "1", "False", "1")


def test_another_version_is_left_alone_and_said_once(monkeypatch):
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    monkeypatch.delenv(SWITCH, raising=False)
    monkeypatch.setattr(module_hook, "_WARNED", set())
    monkeypatch.setattr(skip.importlib.metadata, "version", lambda name: "0.99.0")
    before = [finder for finder in sys.meta_path if getattr(finder, "fullname", None) != MODULE]
    monkeypatch.setattr(sys, "meta_path", list(before))  # not armed yet in this process (conftest may have)
    with pytest.warns(UnverifiedMegatronWarning, match="megatron-core 0.99.0 is installed"):
        assert skip_unified_memory_build() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert skip_unified_memory_build() is False  # once per process
    assert sys.meta_path == before
