"""Lightning recognises compiled modules without importing TorchDynamo in the ``bionemo`` command.

(bionemo.core.defer_lightning_dynamo)
"""

import hashlib
import importlib.metadata
import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

from bionemo.core.defer_lightning_dynamo import (
    LINE,
    MODULES,
    SWITCH,
    UPSTREAM_SHA256,
    VERIFIED_LIGHTNING,
    OptimizedModule,
    UnverifiedLightningWarning,
    _run_with_stand_in,
    defer_lightning_dynamo,
)
from support.import_hooks import (
    check_already_imported_modules_are_left_alone,
    check_another_version_is_left_alone_and_said_once,
)
from support.import_hooks import clean_meta_path as clean_hooks
from support.import_hooks import run_bionemo_probe as probe

# A clean process running the real `bionemo` entry point with a command added to its app: it imports Lightning,
# reports whether TorchDynamo came with it, then hands Lightning a LightningModule before and after torch.compile
# (which imports TorchDynamo; nothing is compiled until called, and nothing is called).
CHILD = textwrap.dedent(
    """
    import json, sys
    import typer
    from bionemo.cli import app as cli

    @cli.app.command("probe")
    def probe() -> None:
        import lightning.pytorch as pl
        import torch
        from lightning.fabric import wrappers
        from lightning.pytorch.utilities import compile as lightning_compile

        dynamo_after_import = "torch._dynamo" in sys.modules
        module = pl.LightningModule()
        plain = lightning_compile._maybe_unwrap_optimized(module) is module
        compiled = torch.compile(module)
        unwrapped = lightning_compile._maybe_unwrap_optimized(compiled) is module
        print(json.dumps({
            "dynamo_after_import": dynamo_after_import,
            "stand_in": [wrappers.OptimizedModule.__module__, lightning_compile.OptimizedModule.__module__],
            "plain_module_kept": plain,
            "compiled_module_unwrapped": unwrapped,
            "compiled_is_wrapped": wrappers.is_wrapped(compiled),
        }))
        raise typer.Exit(0)

    sys.argv = ["bionemo", "probe"]
    cli.main()
    """
)


def run_bionemo_probe(value: str | None) -> dict:
    return probe(CHILD, SWITCH, value)


def test_canary_the_installed_upstream_files_are_the_verified_ones():
    """Fails when Lightning changes: re-verify the work-around (or drop it) and update the digests."""
    assert importlib.metadata.version("lightning").split("+")[0] == VERIFIED_LIGHTNING
    distribution = importlib.metadata.distribution("lightning")
    for name, digest in UPSTREAM_SHA256.items():
        source = Path(str(distribution.locate_file(name))).read_bytes()
        assert hashlib.sha256(source).hexdigest() == digest, name
        assert source.decode().count(LINE) == 1, name


def test_the_command_imports_lightning_without_dynamo_and_still_unwraps_compiled_modules():
    report = run_bionemo_probe(None)
    assert report["dynamo_after_import"] is False
    assert report["stand_in"] == ["bionemo.core.defer_lightning_dynamo"] * 2
    assert report["plain_module_kept"] is True
    assert report["compiled_module_unwrapped"] is True
    assert report["compiled_is_wrapped"] is False  # as upstream: a compiled plain module is not a Fabric wrapper


def test_switched_off_lightning_imports_dynamo_as_upstream_does():
    report = run_bionemo_probe("1")
    assert report["dynamo_after_import"] is True
    assert report["stand_in"] == ["torch._dynamo.eval_frame"] * 2
    assert (report["plain_module_kept"], report["compiled_module_unwrapped"]) == (True, True)


def test_the_stand_in_answers_as_torchs_class():
    linear = torch.nn.Linear(2, 2)
    compiled = torch.compile(linear)  # imports torch._dynamo in this process
    assert isinstance(compiled, OptimizedModule)
    assert not isinstance(linear, OptimizedModule)
    assert isinstance(compiled, (torch.nn.Linear, OptimizedModule))  # tuples, as Lightning's collection helpers ask
    assert issubclass(type(compiled), OptimizedModule)
    assert not issubclass(torch.nn.Linear, OptimizedModule)


def test_the_stand_in_answers_false_while_dynamo_is_not_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)
    assert not isinstance(torch.nn.Linear(2, 2), OptimizedModule)
    assert not issubclass(torch.nn.Module, OptimizedModule)


def test_a_module_without_the_line_runs_as_upstream(tmp_path):
    path = tmp_path / "other.py"
    path.write_text("VALUE = 1\n")
    module = ModuleType("other")
    module.__spec__ = importlib.util.spec_from_file_location("other", path)
    ran = []
    _run_with_stand_in(lambda m: ran.append(m), module)
    assert ran == [module]
    assert not hasattr(module, "VALUE")
    path.write_text(f"A = 1\n{LINE}B = A + 1\n")
    _run_with_stand_in(lambda m: ran.append(m), module)
    assert (module.A, module.B, module.OptimizedModule) == (1, 2, OptimizedModule)


@pytest.fixture
def clean_meta_path(monkeypatch):
    return clean_hooks(monkeypatch, SWITCH, *MODULES)


def test_already_imported_modules_are_left_alone(monkeypatch, clean_meta_path):
    check_already_imported_modules_are_left_alone(monkeypatch, MODULES, defer_lightning_dynamo, clean_meta_path)


def test_another_version_is_left_alone_and_said_once_per_module(monkeypatch, clean_meta_path):
    check_another_version_is_left_alone_and_said_once(
        monkeypatch, MODULES, defer_lightning_dynamo, clean_meta_path, UnverifiedLightningWarning, "lightning"
    )
