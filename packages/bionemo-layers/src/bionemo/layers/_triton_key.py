"""Triton's compiler key, kept in a file beside Triton's kernel cache while Triton's own files are unchanged.

Before a process launches its first Triton kernel, Triton computes ``triton_key()``: a SHA-256 over its compiler
and language sources and its ~500 MB ``libtriton`` library, part of every kernel's cache key: 0.26-0.35 s of each
``run predict`` on an H100 (its first batch, kernels already compiled), 0.6 s on a 2-core CPU machine
(docs/benchmarks.md#prediction-start-up).
:func:`remember_compiler_key` makes Triton take the key from a file named by a fingerprint of those same files'
paths, sizes and modification times (and Triton's and Python's versions): computed and written once, read on later
runs. A changed or reinstalled Triton has another fingerprint, so its key is computed afresh. The key itself is
unchanged, so are the kernel cache's entries. ``BIONEMO_TRITON_KEY_CACHE=0`` leaves Triton as it is.
"""

import functools
import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["KEY_CACHE_SWITCH", "remember_compiler_key"]

KEY_CACHE_SWITCH = "BIONEMO_TRITON_KEY_CACHE"
"""Set to ``0`` to let Triton compute its compiler key in every process."""

_HASHED_FOLDERS = ("compiler", "backends", "language", "runtime")
"""Triton's folders whose sources ``triton_key()`` hashes (``runtime`` holds the function itself)."""


@functools.cache
def remember_compiler_key() -> bool:
    """Have Triton read its compiler key from the file of :func:`key_file` (once per process); False if not done.

    Not done where the switch is ``0`` or this Triton has no module-level ``triton_key`` beside ``get_cache_key``
    (the function that builds kernel cache keys from it).
    """
    if os.environ.get(KEY_CACHE_SWITCH, "1") == "0":
        return False
    namespace = _key_namespace()
    if namespace is None:
        return False
    namespace["triton_key"] = functools.cache(_remembered(namespace["triton_key"]))
    return True


def _key_namespace() -> dict | None:
    """The globals ``get_cache_key`` reads ``triton_key`` from (Triton 3.4+: runtime/cache.py; before: compiler.py)."""
    import importlib

    for name in ("triton.runtime.cache", "triton.compiler.compiler"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        build = getattr(module, "get_cache_key", None)
        if build is not None and callable(build.__globals__.get("triton_key")):
            return build.__globals__
    return None


def _remembered(compute: Callable[[], str]) -> Callable[[], str]:
    def triton_key() -> str:
        path = key_file()
        if path is None:
            return compute()
        try:
            return path.read_text()
        except OSError:
            pass
        key = compute()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(key)
            os.replace(partial, path)  # whole or absent: a process beside this one reads either
        except OSError:
            pass  # a read-only cache: computed again next time
        return key

    return triton_key


def key_file(root: Path | None = None) -> Path | None:
    """The file for the key of the Triton installed at ``root`` (default: the imported one), None without libtriton.

    It lies in Triton's cache folder, named by a fingerprint of Triton's and Python's versions and the path, size,
    modification time and inode of each file ``triton_key()`` hashes.
    """
    import triton

    root = root or Path(triton.__file__).parent
    library = [path for path in (root / "_C").glob("libtriton*") if path.is_file()]
    if not library:
        return None
    parts = [triton.__version__, sys.version]
    for path in sorted(library) + sorted(_sources(root)):
        stat = path.stat()
        parts.append(f"{path}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}")
    fingerprint = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]
    return _cache_folder() / "bionemo-triton-key" / fingerprint


def _sources(root: Path) -> list[Path]:
    return [path for folder in _HASHED_FOLDERS for path in (root / folder).rglob("*.py")]


def _cache_folder() -> Path:
    """Triton's kernel cache folder (``triton.knobs.cache.dir`` where Triton has it, else ``TRITON_CACHE_DIR``)."""
    import triton

    knobs = getattr(triton, "knobs", None)
    folder = getattr(getattr(knobs, "cache", None), "dir", None)
    if folder:
        return Path(folder)
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
