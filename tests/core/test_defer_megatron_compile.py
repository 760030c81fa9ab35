"""megatron-core's ``torch.compile`` decorations import torch's compiler on first call in the ``bionemo`` command.

(bionemo.core.defer_megatron_compile)
"""

import hashlib
import importlib.metadata
import sys
import textwrap
import warnings
from pathlib import Path
from types import ModuleType

import pytest
import torch

import bionemo.core.module_hook as module_hook
from bionemo.core.defer_megatron_compile import (
    MODULE,
    SWITCH,
    UPSTREAM_SHA256,
    _run_then_defer,
    compile_on_first_call,
    defer_megatron_compile,
)
from bionemo.core.skip_unified_memory_build import VERIFIED_MEGATRON_CORE, UnverifiedMegatronWarning
from support.import_hooks import clean_meta_path as clean_hooks
from support.import_hooks import run_bionemo_probe as probe

COMPILER = ("torch._inductor.compile_fx", "networkx")
"""What ``torch.compile(fn)`` imports and nothing else in megatron-core's import does."""

# A clean process running the real `bionemo` entry point with a command added to its app: it reports whether the
# work-around was armed before it ran, imports megatron-core (and its fused bias-GELU module), then reports what
# sys.modules holds and what wraps one of megatron's decorated functions. Nothing is compiled: inductor on a CPU
# machine needs a C++ toolchain and minutes; test_compile_on_first_call covers the call.
CHILD = textwrap.dedent(
    f"""
    import json, sys
    import typer
    from bionemo.cli import app as cli
    from bionemo.core.defer_megatron_compile import MODULE
    from bionemo.core.megatron_env import prepare_megatron_import
    from bionemo.core.module_hook import module_hooked

    @cli.app.command("probe")
    def probe() -> None:
        armed_before = int(module_hooked(MODULE))
        prepare_megatron_import()
        import megatron.core
        import megatron.core.jit as jit
        import torch
        from megatron.core.fusions.fused_bias_gelu import bias_gelu

        print(json.dumps({{
            "armed_before": armed_before,
            "finders_left": int(module_hooked(MODULE)),
            "imported": [name in sys.modules for name in {COMPILER!r}],
            "jit_fuser_is_compile": jit.jit_fuser is torch.compile,
            "bias_gelu": [bias_gelu.__name__, bias_gelu.__code__.co_name],
        }}))
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
    path = importlib.metadata.distribution("megatron-core").locate_file("megatron/core/jit.py")
    assert hashlib.sha256(Path(str(path)).read_bytes()).hexdigest() == UPSTREAM_SHA256


def test_the_command_arms_it_and_megatron_comes_without_the_compiler():
    report = run_bionemo_probe(None)
    assert (report["armed_before"], report["finders_left"]) == (1, 0)
    assert report["imported"] == [False, False]
    assert report["jit_fuser_is_compile"] is False
    assert report["bias_gelu"] == ["bias_gelu", "run"]  # megatron's function, behind compile_on_first_call


def test_switched_off_megatron_compiles_at_import_as_upstream_does():
    report = run_bionemo_probe("1")
    assert report["armed_before"] == 0
    assert report["imported"] == [True, True]
    assert report["jit_fuser_is_compile"] is True
    assert report["bias_gelu"][1] != "run"


def test_compile_on_first_call_compiles_once_and_runs_the_compiled_function(monkeypatch):
    compiled_from = []

    def fake_compile(fn):
        compiled_from.append(fn)
        return lambda *args, **kwargs: ("compiled", fn(*args, **kwargs))

    monkeypatch.setattr(torch, "compile", fake_compile)

    def add(a, b=1):
        """Adds."""
        return a + b

    deferred = compile_on_first_call(add)
    assert compiled_from == []  # nothing compiled (or imported) when decorating
    assert (deferred.__name__, deferred.__doc__) == ("add", "Adds.")
    assert deferred(2, b=3) == ("compiled", 5)
    assert deferred(1) == ("compiled", 2)
    assert compiled_from == [add]  # once


def test_only_torch_compile_is_replaced(monkeypatch):
    script = ModuleType(MODULE)

    def run_jit_script(module):
        module.jit_fuser = torch.jit.script  # what megatron picks on torch < 2.2

    _run_then_defer(run_jit_script, script)
    assert script.jit_fuser is torch.jit.script
    compiled = ModuleType(MODULE)
    _run_then_defer(lambda module: setattr(module, "jit_fuser", torch.compile), compiled)
    assert compiled.jit_fuser is compile_on_first_call


@pytest.fixture
def clean_meta_path(monkeypatch):
    return clean_hooks(monkeypatch, SWITCH, MODULE)


def test_already_imported_jit_is_left_alone(monkeypatch, clean_meta_path):
    monkeypatch.setitem(sys.modules, MODULE, sys.modules.get(MODULE) or ModuleType(MODULE))
    assert defer_megatron_compile() is False
    assert sys.meta_path == clean_meta_path


def test_another_version_is_left_alone_and_said_once(monkeypatch, clean_meta_path):
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    monkeypatch.setattr(module_hook.importlib.metadata, "version", lambda name: "0.99.0")
    with pytest.warns(UnverifiedMegatronWarning, match="megatron-core 0.99.0 is installed"):
        assert defer_megatron_compile() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert defer_megatron_compile() is False  # once per process
    assert sys.meta_path == clean_meta_path
