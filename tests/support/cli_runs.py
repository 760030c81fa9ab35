"""Run the `bionemo` command in a subprocess on the CPU, as a user would."""

import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BIONEMO = [sys.executable, "-m", "bionemo.cli"]

CPU_ONLY = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
"""These are CPU runs, also on a machine with GPUs (hidden from the child processes)."""


def bionemo(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``bionemo *args`` in ``cwd``; it must succeed (its output's end is shown when it does not)."""
    result = subprocess.run(
        [*BIONEMO, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, env=CPU_ONLY
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def two_at_a_time(*runs: Callable[[], Any]) -> list[Any]:
    """Call ``runs`` (independent command runs), two at once; their results in order.

    A run's start-up is mostly one core's imports, so two overlap well on the 2-core CI machine (a module's
    fixture of several runs then takes about half as long); an exception in a run is raised here.
    """
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda run: run(), runs))


def bionemo_refused(*args: str, cwd: Path, timeout: int = 120) -> str:
    """Run ``bionemo *args`` in ``cwd``; it must exit with code 2. Its message, on one line (box drawing removed)."""
    result = subprocess.run(
        [*BIONEMO, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**CPU_ONLY, "COLUMNS": "2000"},
    )
    text = " ".join((result.stdout + result.stderr).replace("│", " ").split())
    assert result.returncode == 2, text[-3000:]
    return text
