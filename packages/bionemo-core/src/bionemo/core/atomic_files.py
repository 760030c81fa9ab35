"""Atomic file replacement, with the standard library only (no torch: input checks import it)."""

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["give_default_permissions", "replaced_atomically"]


def give_default_permissions(path: Path | str) -> None:
    """Give ``path`` the mode ``open`` or ``mkdir`` would: ``0o666`` (file) or ``0o777`` (folder) minus the umask.

    ``tempfile.mkstemp`` and ``mkdtemp`` create ``0o600`` files and ``0o700`` folders; call this on one before
    renaming it into place, so the result reads like any other file the user writes.
    """
    umask = os.umask(0)  # the only way to read the umask: set it and put it back
    os.umask(umask)
    os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~umask)


@contextlib.contextmanager
def replaced_atomically(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` to write; renamed to ``path`` when the block ends without an error.

    The file gets the usual permissions (:func:`give_default_permissions`). On any error the temporary file is
    removed and ``path`` is left as it was: a reader sees the old file or the whole new one, never a part.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        give_default_permissions(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
