"""A package's public names served from their submodules on first use (PEP 562), so importing it stays cheap."""

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, modules: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` that imports each name of ``modules[sub]`` from ``package.sub``.

    Use as ``__getattr__ = lazy_exports(__name__, {"weights": ("read_weights", ...)})`` in the package's
    ``__init__``. A name is imported on its first access and then kept in the package's namespace; any other
    name raises ``AttributeError`` as a module without it would.
    """
    module_of = {name: sub for sub, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        sub = module_of.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{sub}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
