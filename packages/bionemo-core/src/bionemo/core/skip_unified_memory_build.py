"""Work-around: megatron-core builds a CUDA extension every time it is imported; bionemo never uses it.

Upstream behaviour (megatron-core 0.15.3, ``megatron/core/inference/unified_memory.py``, imported by
``megatron.core`` itself through ``inference_params`` -> ``inference.contexts``): at import it compiles a small
C++/CUDA allocator with ``torch.utils.cpp_extension.load_inline`` ("Build the .so upon import") for dynamic
inference's unified-memory pool, catching ``RuntimeError``/``ImportError``/``OSError`` and warning "Failed to
create unified memory mempool." when that fails. On a GPU machine with nvcc the build runs and fails on every
import, tens of seconds each time (docs/benchmarks.md#prediction-start-up).

The work-around: when ``unified_memory`` is imported, its ``load_inline`` raises ``ImportError`` (megatron's own
fallback: ``has_unified_memory = False``) and megatron's warning about it is not shown; torch's ``load_inline`` is
restored as soon as the module has run. Nothing else is touched; nothing stays patched.

- Applied by :func:`skip_unified_memory_build` (called by :func:`bionemo.core.megatron_env.prepare_megatron_import`,
  before megatron-core's first import) on the verified version only; on another version it is not applied and
  says so once (:class:`UnverifiedMegatronWarning`).
- Switch: ``BIONEMO_MEGATRON_UNIFIED_MEMORY=1`` leaves megatron's build alone (for megatron's dynamic inference).
- Canary: tests/core/test_skip_unified_memory_build.py fails when the upstream file changes.
"""

import hashlib
import importlib.metadata
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bionemo.core.module_hook import hook_verified_module

__all__ = [
    "MODULE",
    "SWITCH",
    "UPSTREAM_SHA256",
    "VERIFIED_MEGATRON_CORE",
    "UnverifiedMegatronWarning",
    "skip_unified_memory_build",
    "upstream_sha256",
]

MODULE = "megatron.core.inference.unified_memory"
VERIFIED_MEGATRON_CORE = "0.15.3"
UPSTREAM_SHA256 = "0f7cd3cf70b9e04d803dbaecce878c9bee187f0c915938c3a5fe9a0bf463d59e"
"""SHA-256 of the verified version's file (the canary test compares the installed one with it)."""
SWITCH = "BIONEMO_MEGATRON_UNIFIED_MEMORY"
_WARNING = "Failed to create unified memory mempool."


class UnverifiedMegatronWarning(UserWarning):
    """A megatron-core work-around was not applied: the installed version is not the one it was verified on."""


def skip_unified_memory_build() -> bool:
    """Arrange for megatron's unified-memory extension not to be built when megatron-core is imported.

    Returns:
        ``True`` when the work-around is armed (or was armed before), ``False`` when it is switched off, the
        module was already imported, megatron-core is not installed or not the verified version.
    """
    return hook_verified_module(
        MODULE,
        _run_without_build,
        distribution="megatron-core",
        verified=VERIFIED_MEGATRON_CORE,
        switch=SWITCH,
        warning=UnverifiedMegatronWarning,
        what="the skip of its unified-memory build (importing megatron-core may compile a CUDA extension)",
    )


def _run_without_build(exec_module: Callable[[ModuleType], None], module: ModuleType) -> None:
    """Runs the module with ``torch.utils.cpp_extension.load_inline`` refusing, then puts torch's back."""
    import torch.utils.cpp_extension as cpp_extension

    original = cpp_extension.load_inline
    cpp_extension.load_inline = _refuse_build  # pyright: ignore[reportAttributeAccessIssue]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_WARNING)
            exec_module(module)
    finally:
        cpp_extension.load_inline = original  # pyright: ignore[reportAttributeAccessIssue]
        if getattr(module, "load_inline", None) is _refuse_build:
            vars(module)["load_inline"] = original  # the module's own name for it, as megatron imported it


def _refuse_build(*args: Any, **kwargs: Any) -> Any:
    raise ImportError(f"bionemo skips megatron-core's unified-memory extension build (set {SWITCH}=1 to build it)")


def upstream_sha256() -> str | None:
    """SHA-256 of the installed :data:`MODULE` file, found without importing megatron; ``None`` if absent."""
    try:
        path = importlib.metadata.distribution("megatron-core").locate_file(MODULE.replace(".", "/") + ".py")
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        return hashlib.sha256(Path(str(path)).read_bytes()).hexdigest()
    except OSError:
        return None
