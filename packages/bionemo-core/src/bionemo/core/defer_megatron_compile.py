"""Work-around: megatron-core imports torch's compiler stack when it is imported, for functions it may never run.

Upstream behaviour (megatron-core 0.15.3, ``megatron/core/jit.py``, imported by ``megatron.core`` itself): on
torch >= 2.2 ``jit_fuser`` is ``torch.compile``, and 36 functions of megatron's fusions and layers are decorated
with it when their modules are imported. ``torch.compile(fn)`` compiles nothing until ``fn`` is first called, but
it imports TorchInductor, functorch's partitioners and NetworkX right away (``megatron.core.fusions``'
``fused_bias_geglu`` is the first to pay: about 1.4 s on the CPU machine, more on the GPU machines,
docs/benchmarks.md#prediction-start-up). No fusion of megatron's is switched on by bionemo's recipes, so a
``bionemo run`` calls none of them.

The work-around: when ``megatron.core.jit`` has run and its ``jit_fuser`` is ``torch.compile``, it is replaced by
:func:`compile_on_first_call`: the decorated function is handed to ``torch.compile`` the first time it is called,
and from then on runs compiled exactly as before. Only the moment of the compiler's import changes.

- Applied by :func:`defer_megatron_compile`, called by the ``bionemo`` command (``bionemo.cli.app.main``) before
  anything is imported, on the verified version only; on another version it is not applied and says so once
  (:class:`bionemo.core.skip_unified_memory_build.UnverifiedMegatronWarning`). Importing a bionemo library does
  not apply it.
- Switch: ``BIONEMO_MEGATRON_EAGER_COMPILE=1`` leaves ``jit_fuser`` alone.
- Canary: tests/core/test_defer_megatron_compile.py fails when the upstream file changes.
"""

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from bionemo.core.module_hook import hook_verified_module
from bionemo.core.skip_unified_memory_build import VERIFIED_MEGATRON_CORE, UnverifiedMegatronWarning

__all__ = ["MODULE", "SWITCH", "UPSTREAM_SHA256", "compile_on_first_call", "defer_megatron_compile"]

MODULE = "megatron.core.jit"
UPSTREAM_SHA256 = "7f0329378a9852409a8384a98f03d67d0eca0336e96c3facfee53e831d576011"
"""SHA-256 of the verified version's file (the canary test compares the installed one with it)."""
SWITCH = "BIONEMO_MEGATRON_EAGER_COMPILE"


def defer_megatron_compile() -> bool:
    """Arrange for megatron's ``jit_fuser`` to be :func:`compile_on_first_call`; imports nothing itself.

    Returns:
        ``True`` when the work-around is armed (or was armed before), ``False`` when it is switched off, the module
        was already imported, megatron-core is not installed or not the verified version.
    """
    return hook_verified_module(
        MODULE,
        _run_then_defer,
        distribution="megatron-core",
        verified=VERIFIED_MEGATRON_CORE,
        switch=SWITCH,
        warning=UnverifiedMegatronWarning,
        what="the deferral of its torch.compile import",
    )


def compile_on_first_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as ``torch.compile(fn)`` runs it, with ``torch.compile`` (and its imports) called on the first call."""
    compiled: Callable[..., Any] | None = None

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal compiled
        if compiled is None:
            import torch

            compiled = torch.compile(fn)
        return compiled(*args, **kwargs)

    return run


def _run_then_defer(exec_module: Callable[[ModuleType], None], module: ModuleType) -> None:
    """Runs the module as upstream does, then puts :func:`compile_on_first_call` where it chose ``torch.compile``."""
    exec_module(module)
    import torch

    if getattr(module, "jit_fuser", None) is torch.compile:
        module.jit_fuser = compile_on_first_call  # pyright: ignore[reportAttributeAccessIssue]
