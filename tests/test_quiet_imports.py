"""Importing bionemo's packages prints nothing; only the known import notes are hidden (bionemo.core.import_notes)."""

import logging
import os
import subprocess
import sys
import warnings

import pytest

from bionemo.core.import_notes import IMPORT_LOG_NOTES, SHOW_IMPORT_NOTES, quiet_import_notes

# Every package, the modules that import megatron-core (the ESM-2 model and steps), then, after the user's own
# warnings, the NeMo adapter (NeMo's import prints its telemetry set-up; its warning hook then drops every
# UserWarning, so the user's warnings come first).
CODE = """
import logging, sys, warnings
import bionemo.core, bionemo.collate, bionemo.losses, bionemo.layers, bionemo.callbacks, bionemo.lightning
import bionemo.llm.lightning, bionemo.recipes, bionemo.recipes.trainers, bionemo.recipes.outputs, bionemo.esm2
import bionemo.esm2.model.esm2, bionemo.esm2.model.steps, bionemo.cli.app
print("imported", file=sys.stderr, flush=True)
warnings.warn("Transformer Engine and Apex are not installed, says the user's own code")
logging.getLogger("megatron.core.utils").warning("another note of megatron-core")
print("warned", file=sys.stderr, flush=True)
import bionemo.lightning._nemo
"""


def test_importing_the_packages_prints_nothing_and_other_warnings_still_show():
    env = {k: v for k, v in os.environ.items() if k != SHOW_IMPORT_NOTES}
    result = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300, check=False, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == ""
    before, rest = result.stderr.split("imported\n", 1)
    between, after = rest.split("warned\n", 1)
    # before: TE / Apex (4 warnings), "end of life", "No CUDA runtime is found, using CUDA_HOME"; after: OneLogger
    assert before == ""
    assert after == ""
    assert "UserWarning: Transformer Engine and Apex are not installed, says the user's own code" in between
    assert "another note of megatron-core" in between


def warned(message: str, module: str) -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_import_notes()
        warnings.warn_explicit(message, UserWarning, filename="x.py", lineno=1, module=module)
    return bool(caught)


def logged(logger: str, message: str) -> bool:
    record = logging.LogRecord(logger, logging.WARNING, "x.py", 1, message, None, None)
    return logging.getLogger(logger).filter(record)


@pytest.fixture
def restored_filters():
    filters = {name: list(logging.getLogger(name).filters) for name in IMPORT_LOG_NOTES}
    yield
    for name, kept in filters.items():
        logging.getLogger(name).filters[:] = kept


@pytest.mark.usefixtures("restored_filters")
def test_only_the_known_notes_of_the_known_modules_are_hidden(monkeypatch):
    monkeypatch.delenv(SHOW_IMPORT_NOTES, raising=False)
    te = "Transformer Engine and Apex are not installed. Falling back to Torch optimizers."
    assert not warned(te, "megatron.core.optimizer")
    assert not warned(te, "megatron_fsdp.utils")
    assert warned(te, "my_package.model")  # the same text from other code
    assert warned("Transformer Engine is the fast path", "megatron.core.optimizer")  # another text
    for logger, message in (
        ("torch.utils.cpp_extension", "No CUDA runtime is found, using CUDA_HOME='/usr/local'"),
        ("megatron.core.utils", "fused_indices_to_multihot has reached end of life. Please migrate to a "
         "non-experimental function."),
        ("nv_one_logger.training_telemetry.api.training_telemetry_provider", "No exporters were provided."),
    ):  # fmt: skip
        assert not logged(logger, message)
        assert logged(logger, "something else")
        assert logged("my_package", message)
    once = {name: list(logging.getLogger(name).filters) for name in IMPORT_LOG_NOTES}
    quiet_import_notes()  # a second call adds nothing
    assert {name: list(logging.getLogger(name).filters) for name in IMPORT_LOG_NOTES} == once


@pytest.mark.usefixtures("restored_filters")
def test_bionemo_show_import_notes_changes_nothing(monkeypatch):
    monkeypatch.setenv(SHOW_IMPORT_NOTES, "1")
    for name in IMPORT_LOG_NOTES:
        logging.getLogger(name).filters[:] = []
    filters = list(warnings.filters)
    assert quiet_import_notes() is False
    assert warnings.filters == filters
    assert all(logging.getLogger(name).filters == [] for name in IMPORT_LOG_NOTES)
