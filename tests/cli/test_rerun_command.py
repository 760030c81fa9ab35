"""The resume command `bionemo run train` prints starts the way the run was started: `uv run`, `python -m`,
`torchrun`, the `bionemo` script by name or by its path."""

import sys
from pathlib import Path

import pytest

from bionemo.cli.run import _launch_words


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """A folder holding executables named ``bionemo``, ``python`` and ``uv``."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("bionemo", "python", "uv"):
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    return folder


def test_the_bionemo_script_found_on_path_by_name(bin_dir):
    assert _launch_words({"PATH": str(bin_dir)}, str(bin_dir / "bionemo"), None) == ["bionemo"]


def test_the_bionemo_script_not_on_path_by_the_path_it_was_run_as(bin_dir, tmp_path):
    assert _launch_words({"PATH": str(tmp_path)}, "venv/bin/bionemo", None) == ["venv/bin/bionemo"]


def test_under_uv_run(bin_dir, tmp_path):
    uv = {"UV_RUN_RECURSION_DEPTH": "1", "UV": str(bin_dir / "uv"), "PATH": str(bin_dir)}
    assert _launch_words(uv, str(bin_dir / "bionemo"), None) == ["uv", "run", "bionemo"]
    assert _launch_words(uv, "/anywhere/__main__.py", "bionemo.cli") == ["uv", "run", "python", "-m", "bionemo.cli"]
    elsewhere = {**uv, "UV": str(tmp_path / "uv")}  # uv was run by a path, not found on PATH
    assert _launch_words(elsewhere, str(bin_dir / "bionemo"), None) == [str(tmp_path / "uv"), "run", "bionemo"]


def test_python_m_bionemo_cli_names_this_interpreter(tmp_path):
    words = _launch_words({"PATH": str(tmp_path)}, "/anywhere/__main__.py", "bionemo.cli")
    assert words == [sys.executable, "-m", "bionemo.cli"]


def test_under_torchrun(bin_dir):
    torchrun = {"TORCHELASTIC_RUN_ID": "none", "LOCAL_WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "1", "PATH": str(bin_dir)}
    counts = ["torchrun", "--nnodes=1", "--nproc-per-node=2"]
    assert _launch_words(torchrun, "/anywhere/__main__.py", "bionemo.cli") == [*counts, "-m", "bionemo.cli"]
    script = str(bin_dir / "bionemo")  # torchrun takes the script's path, not a name to look up
    assert _launch_words(torchrun, script, None) == [*counts, script]
    assert _launch_words({**torchrun, "UV_RUN_RECURSION_DEPTH": "1"}, script, None)[:3] == ["uv", "run", "torchrun"]


def test_another_program_running_the_app_gets_the_bionemo_command(bin_dir):
    assert _launch_words({"PATH": str(bin_dir)}, "/usr/bin/pytest", None) == ["bionemo"]
