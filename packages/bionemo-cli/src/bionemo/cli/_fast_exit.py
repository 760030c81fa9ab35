"""End the ``bionemo`` process without the interpreter's teardown once the command has finished.

After ``run predict`` or ``run train`` the process holds torch, Lightning, NeMo and megatron-core: Python's teardown
then clears thousands of modules and frees their objects one by one, seconds after every output is on disk
(docs/benchmarks.md#prediction-start-up). Nothing of the command's is lost by skipping it: every file is written and
closed inside ``with`` blocks, and what Python does before its teardown is done here in the same order: non-daemon
threads are joined, every ``atexit`` handler runs, the standard streams are flushed. Then ``os._exit`` ends the
process with the command's exit status. A command that ends in anything but ``SystemExit`` with an int or no code (a
traceback, Ctrl-C outside the training loop's handler, an exit message) exits the usual way.
"""

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Callable

__all__ = ["run_then_exit_fast"]


def run_then_exit_fast(command: Callable[[], object]) -> None:
    """Run ``command``; once it has returned or raised ``SystemExit(int | None)``, exit at once with that status."""
    try:
        command()
    except SystemExit as stop:
        if stop.code is not None and not isinstance(stop.code, int):
            raise  # Python prints the message and exits with 1
        status = stop.code or 0
    else:
        status = 0
    _exit_now(status)


def _exit_now(status: int) -> None:
    """What the interpreter does before its teardown, then ``os._exit(status)``."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # noqa: SLF001 - the interpreter's own call at exit; errors are printed, not raised
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # closed, a broken pipe, or None
            stream.flush()
    os._exit(status & 0xFF)
