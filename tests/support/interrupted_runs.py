"""`bionemo run train` in a subprocess, stopped by a signal once its progress bar shows a given step."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

BIONEMO = [sys.executable, "-m", "bionemo.cli"]
MAX_STEPS = "100000"  # never reached: the runs are stopped by signals
STOPPED = re.compile(
    r"Training stopped by (?P<signal>\w+) after step (?P<step>\d+); checkpoint saved to (?P<checkpoint>\S+)\. "
    r"Resume with: (?P<command>.+)"
)


def start(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    """`bionemo *args` with its progress bar drawn (rich treats FORCE_COLOR as a terminal) into ``log``."""
    return launch([*BIONEMO, *args], cwd, log)


def launch(command: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    """``command`` (a printed resume command, say) as :func:`start` runs `bionemo`: its bar drawn into ``log``."""
    env = {**os.environ, "FORCE_COLOR": "1", "COLUMNS": "200"}
    with log.open("wb") as out, log.with_suffix(".err").open("wb") as err:
        return subprocess.Popen(command, cwd=cwd, stdout=out, stderr=err, env=env)


def steps_shown(log: Path) -> list[int]:
    """Every step count the training bar has drawn so far (``<step>/<MAX_STEPS>``)."""
    return [int(n) for n in re.findall(rb"(\d+)/" + MAX_STEPS.encode(), log.read_bytes())]


def stop_once(process: subprocess.Popen, log: Path, shown: int, signum: signal.Signals, *, copies: int = 1) -> re.Match:
    """Send ``signum`` once the bar shows a step of at least ``shown``; the "stopped" line the run printed.

    ``copies`` > 1 sends the rest of them as soon as the run's handler has said it noted the first, as a wrapper
    does that forwards a signal its process group also got (``uv run`` under ``timeout -s INT``): one interrupt
    all the same. (Python runs a handler once for signals that arrive before it runs, so copies sent all at once
    could be taken as one.) Asserts the exit status 128 + ``signum`` and that the line names ``signum``.
    """
    deadline = time.time() + 300
    while max(steps_shown(log), default=-1) < shown:
        assert process.poll() is None, log.with_suffix(".err").read_text()[-3000:]
        assert time.time() < deadline, "training did not start"
        time.sleep(0.2)
    process.send_signal(signum)
    noted = f"{signum.name} received".encode()
    while copies > 1 and noted not in log.with_suffix(".err").read_bytes():
        assert process.poll() is None, log.with_suffix(".err").read_text()[-3000:]
        assert time.time() < deadline, f"{signum.name} was not noted"
        time.sleep(0.001)
    for _ in range(copies - 1):
        process.send_signal(signum)
    returncode = process.wait(timeout=180)
    err = log.with_suffix(".err").read_text()
    assert returncode == 128 + signum, err[-3000:]
    found = STOPPED.search(err)
    assert found, err[-3000:]
    assert found["signal"] == signum.name
    return found
