"""Stand-ins for upstream names that an import-time work-around keeps a module from importing.

A class stand-in answers ``isinstance`` / ``issubclass`` exactly as the upstream class would, without importing it:
an instance of a class can only exist once the module defining it is imported, so while that module is not in
``sys.modules`` the answer is false, and once it is, the stand-in asks the upstream class. A function stand-in imports
its module on the first call and calls the upstream function.

Used by :mod:`bionemo.core.defer_lightning_dynamo` and :mod:`bionemo.core.defer_megatron_dtensor`.
"""

import importlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["class_stand_in", "function_stand_in"]


class _AsksUpstreamOnceImported(type):
    """Metaclass of the class stand-ins: instance and subclass checks go to the upstream class once it exists."""

    _upstream: tuple[str, str]

    def _upstream_class(cls) -> type | None:
        module_name, name = cls._upstream
        module = sys.modules.get(module_name)
        return getattr(module, name, None) if module is not None else None

    def __instancecheck__(cls, instance: Any) -> bool:
        upstream = cls._upstream_class()
        return upstream is not None and isinstance(instance, upstream)

    def __subclasscheck__(cls, subclass: type) -> bool:
        upstream = cls._upstream_class()
        return upstream is not None and issubclass(subclass, upstream)


def class_stand_in(module: str, name: str, *, owner: str) -> type:
    """A class named ``name`` (in module ``owner``) that answers type checks as ``module.name`` would."""
    doc = f"Stands in for ``{module}.{name}`` in ``isinstance`` / ``issubclass`` (see {owner})."
    namespace = {"__module__": owner, "__doc__": doc, "__qualname__": name, "_upstream": (module, name)}
    return _AsksUpstreamOnceImported(name, (), namespace)


def function_stand_in(module: str, name: str, *, owner: str) -> Callable[..., Any]:
    """A function that imports ``module`` on its first call and calls ``module.name`` with its arguments."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__module__ = owner
    call.__doc__ = f"``{module}.{name}``, its module imported on the first call (see {owner})."
    return call
