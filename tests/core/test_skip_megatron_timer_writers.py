"""megatron-core's timers import no wandb or TensorBoard in the ``bionemo`` command.

(bionemo.core.skip_megatron_timer_writers)
"""

import hashlib
import importlib.metadata
import sys
import textwrap
import warnings
from pathlib import Path
from types import ModuleType

import pytest

import bionemo.core.module_hook as module_hook
from bionemo.core.skip_megatron_timer_writers import (
    MODULE,
    SWITCH,
    UPSTREAM_SHA256,
    WRITERS,
    skip_megatron_timer_writers,
)
from bionemo.core.skip_unified_memory_build import VERIFIED_MEGATRON_CORE, UnverifiedMegatronWarning
from support.import_hooks import clean_meta_path as clean_hooks
from support.import_hooks import run_bionemo_probe as probe

# A clean process running the real `bionemo` entry point with a command added to its app: it reports whether the
# work-around was armed before it ran, imports megatron-core, then what megatron's timers and sys.modules hold, and
# whether a later import of TensorBoard (as Lightning's logger does) still works.
CHILD = textwrap.dedent(
    """
    import json, sys
    import typer
    from bionemo.cli import app as cli
    from bionemo.core.megatron_env import prepare_megatron_import
    from bionemo.core.module_hook import module_hooked
    from bionemo.core.skip_megatron_timer_writers import MODULE, WRITERS

    @cli.app.command("probe")
    def probe() -> None:
        armed_before = int(module_hooked(MODULE))
        prepare_megatron_import()
        import megatron.core
        import megatron.core.timers as timers

        report = {
            "armed_before": armed_before,
            "finders_left": int(module_hooked(MODULE)),
            "imported": [name in sys.modules for name in WRITERS],
            "timers": [timers.wandb is not None, timers.SummaryWriter is not None],
        }
        from torch.utils.tensorboard import SummaryWriter

        report["tensorboard_later"] = SummaryWriter.__module__.startswith("torch.utils.tensorboard")
        print(json.dumps(report))
        raise typer.Exit(0)

    sys.argv = ["bionemo", "probe"]
    cli.main()
    """
)


def run_bionemo_probe(value: str | None) -> dict:
    return probe(CHILD, SWITCH, value)


def test_canary_the_installed_upstream_file_is_the_verified_one():
    """Fails when megatron-core changes: re-verify the work-around (or drop it) and update the digest."""
    assert importlib.metadata.version("megatron-core").split("+")[0] == VERIFIED_MEGATRON_CORE
    path = importlib.metadata.distribution("megatron-core").locate_file("megatron/core/timers.py")
    assert hashlib.sha256(Path(str(path)).read_bytes()).hexdigest() == UPSTREAM_SHA256


def test_the_command_arms_it_and_megatron_comes_without_the_writers():
    report = run_bionemo_probe(None)
    assert (report["armed_before"], report["finders_left"]) == (1, 0)
    assert report["imported"] == [False, False]
    assert report["timers"] == [False, False]  # megatron's own fallback for missing packages
    assert report["tensorboard_later"] is True  # nothing stays hidden


def test_switched_off_megatron_imports_them_as_upstream_does():
    report = run_bionemo_probe("1")
    assert report["armed_before"] == 0
    assert report["imported"] == [True, True]
    assert report["timers"] == [True, True]


@pytest.fixture
def clean_meta_path(monkeypatch):
    return clean_hooks(monkeypatch, SWITCH, MODULE)


def test_already_imported_timers_are_left_alone(monkeypatch, clean_meta_path):
    monkeypatch.setitem(sys.modules, MODULE, sys.modules.get(MODULE) or ModuleType(MODULE))
    assert skip_megatron_timer_writers() is False
    assert sys.meta_path == clean_meta_path


def test_a_writer_imported_before_is_left_in_place(monkeypatch):
    """Only writers not yet imported are hidden, and only while the module runs."""
    from bionemo.core.skip_megatron_timer_writers import _run_without_writers

    imported = ModuleType(WRITERS[0])
    monkeypatch.setitem(sys.modules, WRITERS[0], imported)
    monkeypatch.delitem(sys.modules, WRITERS[1], raising=False)
    seen = {}

    def exec_module(module: ModuleType) -> None:
        seen.update({name: sys.modules.get(name, "absent") for name in WRITERS})

    _run_without_writers(exec_module, ModuleType(MODULE))
    assert seen == {WRITERS[0]: imported, WRITERS[1]: None}
    assert sys.modules[WRITERS[0]] is imported
    assert WRITERS[1] not in sys.modules


def test_another_version_is_left_alone_and_said_once(monkeypatch, clean_meta_path):
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    monkeypatch.setattr(module_hook.importlib.metadata, "version", lambda name: "0.99.0")
    with pytest.warns(UnverifiedMegatronWarning, match="megatron-core 0.99.0 is installed"):
        assert skip_megatron_timer_writers() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert skip_megatron_timer_writers() is False  # once per process
    assert sys.meta_path == clean_meta_path
