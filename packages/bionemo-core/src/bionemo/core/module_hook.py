"""A one-shot import hook: the first import of one module runs its code through a wrapper, then the hook is gone.

The import-time work-arounds of this package (:mod:`bionemo.core.skip_unified_memory_build`,
:mod:`bionemo.core.skip_torchmetrics_imports`, :mod:`bionemo.core.skip_megatron_timer_writers`) change what one
upstream module does while it is first executed, without patching it on disk and without importing it early.
"""

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["ModuleHook", "hook_module", "hook_verified_module", "module_hooked", "run_with_lines_replaced"]

ExecModule = Callable[[ModuleType], None]
Around = Callable[[ExecModule, ModuleType], object]
"""``around(exec_module, module)``: runs the module (by calling ``exec_module(module)``) with what it changes."""
_WARNED: set[str] = set()
"""Modules whose unverified-version warning was given (once per process)."""


class ModuleHook(importlib.abc.MetaPathFinder):
    """Finds nothing but :attr:`fullname`, whose loader runs the module through :attr:`around`.

    It leaves ``sys.meta_path`` as soon as it has found the module: one module, once.
    """

    def __init__(self, fullname: str, around: Around) -> None:
        self.fullname = fullname
        self.around = around

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> Any:
        """The spec of :attr:`fullname` with its loader wrapped; ``None`` for every other module."""
        if fullname != self.fullname:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # also keeps find_spec below from finding this hook again
        spec = importlib.util.find_spec(fullname)
        if spec is None or not isinstance(spec.loader, importlib.abc.Loader):
            return spec
        spec.loader = _AroundLoader(spec.loader, self.around)
        return spec


class _AroundLoader(importlib.abc.Loader):
    """The module's own loader, whose ``exec_module`` runs inside ``around``."""

    def __init__(self, loader: importlib.abc.Loader, around: Around) -> None:
        self.loader = loader
        self.around = around

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.around(self.loader.exec_module, module)


def module_hooked(fullname: str) -> bool:
    """Whether a :class:`ModuleHook` for ``fullname`` is waiting in ``sys.meta_path``."""
    return any(isinstance(finder, ModuleHook) and finder.fullname == fullname for finder in sys.meta_path)


def hook_module(fullname: str, around: Around) -> None:
    """Put a :class:`ModuleHook` for ``fullname`` first in ``sys.meta_path``, unless one is already waiting there."""
    if not module_hooked(fullname):
        sys.meta_path.insert(0, ModuleHook(fullname, around))


def hook_verified_module(
    fullname: str, around: Around, *, distribution: str, verified: str, switch: str, warning: type[Warning], what: str
) -> bool:
    """Arm :func:`hook_module` for an upstream module, only where it is safe; imports nothing itself.

    Not armed when the environment variable ``switch`` is ``1``, ``fullname`` was already imported, or
    ``distribution`` is not installed; on a version other than ``verified`` it warns once (``warning``, saying that
    ``what`` was not applied) and is not armed.

    Returns:
        ``True`` when the hook is waiting (now or from before), else ``False``.
    """
    if os.environ.get(switch) == "1" or fullname in sys.modules:
        return False
    if module_hooked(fullname):
        return True
    try:
        version = importlib.metadata.version(distribution).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return False
    if version != verified:
        if fullname not in _WARNED:
            _WARNED.add(fullname)
            warnings.warn(
                f"bionemo: {distribution} {version} is installed, {what} was verified on {verified} only: not applied",
                warning,
                stacklevel=3,
            )
        return False
    hook_module(fullname, around)
    return True


def run_with_lines_replaced(exec_module: ExecModule, module: ModuleType, lines: Mapping[str, str]) -> bool:
    """Run ``module``'s own source with each key of ``lines`` (a whole line, its newline included) replaced.

    Each key must occur exactly once and each value be one line, so the rest of the source, its line numbers and
    its other imports stay upstream's. Where the module has no Python source or any key is not found exactly once,
    ``exec_module(module)`` runs upstream's code unchanged.

    Returns:
        ``True`` when the replaced source ran, ``False`` when upstream's code ran.
    """
    origin = module.__spec__.origin if module.__spec__ is not None else None
    source = Path(origin).read_text() if origin and origin.endswith(".py") else ""
    if origin is None or any(source.count(line) != 1 for line in lines):
        exec_module(module)
        return False
    for line, replacement in lines.items():
        source = source.replace(line, replacement)
    exec(compile(source, origin, "exec", dont_inherit=True), module.__dict__)  # noqa: S102  # upstream's own source
    return True
