"""Shared pieces of the tests of bionemo.core's import-time work-arounds (tests/core/test_skip_*, test_defer_*)."""

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable
from types import ModuleType

import pytest

import bionemo.core.module_hook as module_hook


def run_bionemo_probe(child: str, switch: str, value: str | None, timeout: float = 600) -> dict:
    """Run ``child`` (a script adding a ``probe`` command to the ``bionemo`` app) in a clean process.

    ``switch`` is removed from the environment, then set to ``value`` unless that is ``None``. Returns the JSON
    object the probe printed last.
    """
    env = {k: v for k, v in os.environ.items() if k != switch}
    if value is not None:
        env[switch] = value
    result = subprocess.run(
        [sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def clean_meta_path(monkeypatch: pytest.MonkeyPatch, switch: str, *modules: str) -> list:
    """This process without the hooks of ``modules``, ``switch`` or the warned-once flags (restored after the test).

    Returns:
        ``sys.meta_path`` as it now is, for comparison after the test's calls.
    """
    monkeypatch.delenv(switch, raising=False)
    monkeypatch.setattr(module_hook, "_WARNED", set())
    before = [finder for finder in sys.meta_path if getattr(finder, "fullname", None) not in modules]
    monkeypatch.setattr(sys, "meta_path", list(before))
    return before


def check_already_imported_modules_are_left_alone(
    monkeypatch: pytest.MonkeyPatch, modules: Iterable[str], arm: Callable[[], bool], clean: list
) -> None:
    """``arm()`` answers ``False`` and adds no hook when every one of ``modules`` is already imported."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or ModuleType(name))
    assert arm() is False
    assert sys.meta_path == clean


def check_another_version_is_left_alone_and_said_once(
    monkeypatch: pytest.MonkeyPatch,
    modules: Iterable[str],
    arm: Callable[[], bool],
    clean: list,
    warning: type[Warning],
    distribution: str,
) -> None:
    """On another installed version ``arm()`` warns once (``warning``, naming it), answers ``False``, adds no hook."""
    for name in modules:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(module_hook.importlib.metadata, "version", lambda name: "9.9.0")
    with pytest.warns(warning, match=f"{distribution} 9.9.0 is installed"):
        assert arm() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert arm() is False
    assert sys.meta_path == clean
