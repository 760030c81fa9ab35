"""The ``bionemo`` entry point ends the process right after its exit handlers, without the interpreter's teardown."""

import subprocess
import sys
import textwrap

import pytest

# A command added to the real app in a child process: it writes unflushed output, registers an exit handler
# and exits with --code (or raises); an object in __main__ reports the teardown that clears modules.
PROBE = textwrap.dedent(
    """
    import atexit, os, sys, types
    atexit.register(lambda: print("earlier handler ran", flush=True))  # registered before bionemo is imported
    import typer
    from bionemo.cli import app as cli

    class Teardown:
        def __del__(self):
            os.write(1, b"teardown ran\\n")  # print() may be gone by then

    holder = types.ModuleType("teardown_probe")  # cleared, like every module, by the interpreter's teardown
    holder.keep = Teardown()
    sys.modules["teardown_probe"] = holder
    del holder

    @cli.app.command("probe")
    def probe(code: int = 0, crash: bool = False) -> None:
        atexit.register(lambda: print("atexit ran", flush=True))
        print("output;", end="")
        if crash:
            raise RuntimeError("boom")
        raise typer.Exit(code)

    sys.argv = ["bionemo", "probe", *sys.argv[1:]]
    cli.main()
    """
)


def probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("code", [0, 3])
def test_exit_handlers_run_and_teardown_is_skipped(code: int) -> None:
    result = probe("--code", str(code))
    assert result.returncode == code, result.stderr
    assert result.stdout == "output;atexit ran\nearlier handler ran\n"  # every handler, no "teardown ran"


def test_usage_error_keeps_exit_status_2() -> None:
    result = probe("--code", "notanumber")
    assert result.returncode == 2
    assert "Usage: bionemo probe" in result.stderr
    assert "teardown ran" not in result.stdout


def test_an_unexpected_exception_gets_the_usual_teardown() -> None:
    result = probe("--crash")
    assert result.returncode == 1
    assert "RuntimeError: boom" in result.stderr
    assert result.stdout == "output;atexit ran\nearlier handler ran\nteardown ran\n"
