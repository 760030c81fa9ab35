"""What every work-around of an upstream problem has: a name, the problem, the versions it was verified on.

A :class:`Workaround` is a frozen description; :meth:`Workaround.apply` checks the installed versions and,
when they are the verified ones, installs it through a :class:`Patches` record, whose :meth:`Patches.restore`
puts back every original. On other versions nothing is installed and a :class:`UnverifiedUpstreamWarning`
naming the work-around and both sets of versions is issued once per process: a newer release may have fixed
the problem, or changed the code the work-around replaces (the canaries in
``tests/lightning/test_workaround_canaries.py`` compare ``Workaround.sources`` with the installed code).
"""

import dataclasses
import functools
import hashlib
import importlib
import importlib.metadata
import inspect
import warnings
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, Literal

__all__ = ["Patches", "Stage", "UnverifiedUpstreamWarning", "Workaround", "installed_version", "source_digest"]

Stage = Literal["fit", "validate", "test", "predict"]
ALL_STAGES: frozenset[Stage] = frozenset({"fit", "validate", "test", "predict"})

_MISSING = object()
_warned: set[str] = set()


class UnverifiedUpstreamWarning(UserWarning):
    """A work-around was not applied: the installed upstream versions are not the ones it was verified on."""


@dataclasses.dataclass(slots=True)
class _Change:
    owner: Any
    key: str
    original: Any  # _MISSING: the key was not the owner's own attribute / item
    item: bool  # a mapping item (``owner[key]``) rather than an attribute


class Patches:
    """Attributes and mapping items set through it, with their originals, restored in reverse order.

    Usable as a context manager: leaving the ``with`` block restores everything set inside it.
    """

    def __init__(self) -> None:
        self._changes: list[_Change] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        """``setattr(owner, name, value)``, remembering the original.

        An attribute that was not in the owner's own ``__dict__`` (a class's inherited method, a method of an
        object's class) is deleted again by the restore, so the owner is left as it was; a property or slot
        gets its original value set back.
        """
        if hasattr(owner, "__dict__") and not _is_data_descriptor(inspect.getattr_static(type(owner), name, None)):
            original = vars(owner).get(name, _MISSING)
        else:
            original = getattr(owner, name)
        self._changes.append(_Change(owner, name, original, item=False))
        setattr(owner, name, value)

    def set_item(self, mapping: MutableMapping[str, Any], key: str, value: Any) -> None:
        """``mapping[key] = value`` (e.g. in ``sys.modules``), remembering whether and what was there."""
        self._changes.append(_Change(mapping, key, mapping.get(key, _MISSING), item=True))
        mapping[key] = value

    def has(self, owner: Any, name: str) -> bool:
        """Whether ``owner.name`` (or ``owner[name]``) was set through this record and not restored yet."""
        return any(change.owner is owner and change.key == name for change in self._changes)

    def __len__(self) -> int:
        return len(self._changes)

    def restore(self) -> None:
        """Put every original back, the last change first, and forget them."""
        while self._changes:
            change = self._changes.pop()
            if change.item:
                if change.original is _MISSING:
                    change.owner.pop(change.key, None)
                else:
                    change.owner[change.key] = change.original
            elif change.original is _MISSING:
                delattr(change.owner, change.key)
            else:
                setattr(change.owner, change.key, change.original)

    def __enter__(self) -> "Patches":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()


def _is_data_descriptor(attribute: object) -> bool:
    return hasattr(type(attribute), "__set__") or hasattr(type(attribute), "__delete__")


@functools.cache
def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` without a local ``+...`` suffix, or ``None`` if not installed."""
    try:
        return importlib.metadata.version(distribution).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def resolve(target: str) -> Any:
    """The object named ``"package.module:Qualified.name"``."""
    module_name, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split(".") if qualname else ():
        obj = inspect.getattr_static(obj, part) if isinstance(obj, type) else getattr(obj, part)
    return obj


def source_digest(target: str) -> str:
    """The first 16 hex digits of the SHA-256 of the installed source of ``target`` (see :func:`resolve`)."""
    obj = resolve(target)
    function: Any = obj.fget if isinstance(obj, property) else getattr(obj, "__func__", obj)
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Workaround:
    """One work-around of one upstream problem."""

    name: str
    """What it does, in snake case; the name of its module and the one to give ``MegatronCompatCallback(skip=...)``."""
    upstream: str
    """The upstream behaviour it works around (and the issue, where there is one)."""
    verified: Mapping[str, str]
    """Distribution name -> the exact version it was verified on; on any other installed version it is not applied."""
    sources: Mapping[str, str]
    """``"module:Qualified.name"`` of each upstream function it depends on -> :func:`source_digest` when verified.

    Empty only for a work-around that replaces no upstream code."""
    stages: frozenset[Stage] = ALL_STAGES
    """The trainer stages that need it (under MegatronStrategy)."""
    speed_up: bool = False
    """A speed-up rather than a fix: results are the same without it."""
    install: Callable[[Patches], None] | None = None
    """Installs a process-wide patch through the record; ``None`` when the callback's hooks do the work."""

    def __post_init__(self) -> None:
        if not self.verified:
            raise ValueError(f"Workaround {self.name!r}: verified must name at least one distribution and version")
        unknown = set(self.stages) - ALL_STAGES
        if unknown:
            raise ValueError(f"Workaround {self.name!r}: stages {sorted(unknown)} are not in {sorted(ALL_STAGES)}")

    def version_mismatch(self) -> dict[str, tuple[str, str | None]]:
        """Distribution -> (verified, installed) for each installed version that is not the verified one."""
        installed = {name: installed_version(name) for name in self.verified}
        return {name: (want, installed[name]) for name, want in self.verified.items() if installed[name] != want}

    def apply(self, patches: Patches) -> bool:
        """Install it through ``patches`` if the installed versions are the verified ones.

        Returns:
            Whether it applies here. When not, a :class:`UnverifiedUpstreamWarning` is issued (once per process
            and work-around) and nothing is installed.
        """
        mismatch = self.version_mismatch()
        if mismatch:
            if self.name not in _warned:
                _warned.add(self.name)
                found = ", ".join(
                    f"{name} {have or 'not installed'} (verified: {want})" for name, (want, have) in mismatch.items()
                )
                warnings.warn(
                    f"bionemo work-around {self.name!r} not applied: installed {found}. It works around: "
                    f"{self.upstream.splitlines()[0]}",
                    UnverifiedUpstreamWarning,
                    stacklevel=2,
                )
            return False
        if self.install is not None:
            self.install(patches)
        return True
