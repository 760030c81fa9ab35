"""`bionemo run` is quiet by default: stderr holds no library chatter unless `--verbose` is given."""

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from lightning.fabric.utilities.warnings import PossibleUserWarning

from bionemo.core.import_notes import SHOW_IMPORT_NOTES
from bionemo.core.library_chatter import quiet_libraries
from bionemo.esm2.data.readers import read_sequences
from bionemo.esm2.recipes import BUNDLED_SEQUENCES

BIONEMO = [sys.executable, "-m", "bionemo.cli"]

# Pieces of the lines torch, megatron-core, NeMo, OneLogger and Lightning printed before `run` was quiet.
LIBRARY_LINES = (
    "Apex", "Transformer Engine", "unified memory", "CUDA_HOME", "OneLogger", "exporters", "end of life",
    "GPU available", "TPU available", "Tip", "sync_dist", "Trainer(", "Trainer.fit", "NeMo W", "NeMo I",
    "UserWarning", "DeprecationWarning", "FutureWarning", "warnings.warn",
)  # fmt: skip


def bionemo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A CPU run, also on a machine with GPUs (they are hidden from the child process)."""
    cpu_only = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [*BIONEMO, *args], cwd=cwd, capture_output=True, text=True, timeout=600, check=False, env=cpu_only
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def chatter(result: subprocess.CompletedProcess) -> list[str]:
    """Lines of stderr that are neither blank nor a progress bar (the tool's own output goes to stdout)."""
    return [line for line in result.stderr.splitlines() if line.strip() and "━" not in line]


@pytest.fixture(scope="module")
def small_fasta(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "four.fasta"
    path.write_text("".join(f">{r.id}\n{r.sequence}\n" for r in read_sequences(BUNDLED_SEQUENCES)[:4]))
    return path


def test_predict_prints_only_its_progress_and_summary_and_verbose_brings_the_libraries_back(tmp_path, small_fasta):
    quiet = bionemo("run", "predict", "--data", str(small_fasta), "--output-dir", str(tmp_path / "q"), cwd=tmp_path)
    assert chatter(quiet) == []
    assert [line for line in quiet.stdout.splitlines() if any(p in line for p in LIBRARY_LINES)] == []
    assert "bionemo run predict" in quiet.stdout
    assert "mean masked-token perplexity" in quiet.stdout

    loud = bionemo(
        "run", "predict", "--verbose", "--data", str(small_fasta), "--output-dir", str(tmp_path / "v"), cwd=tmp_path
    )  # fmt: skip
    shown = [line for line in chatter(loud) if any(p in line for p in LIBRARY_LINES)]
    assert any("Apex" in line for line in shown), loud.stderr  # megatron-core's (predict imports no NeMo)
    assert any("GPU available" in line for line in shown), loud.stderr
    assert "bionemo run predict" in loud.stdout


def test_train_prints_only_its_own_lines(tmp_path):
    result = bionemo(
        "run", "train", "--max-steps", "2", "--val-check-interval", "1", "--output-dir", str(tmp_path / "t"),
        cwd=tmp_path,
    )  # fmt: skip
    assert chatter(result) == []  # before: Apex / unified memory / OneLogger / sync_dist / Lightning info lines
    assert [line for line in result.stdout.splitlines() if any(p in line for p in LIBRARY_LINES)] == []
    assert "bionemo run train" in result.stdout
    assert (tmp_path / "t" / "model.safetensors").is_file()


@pytest.fixture
def restored_logging():
    names = ("megatron", "nv_one_logger", "torch.utils.cpp_extension", "lightning.pytorch.utilities.rank_zero")
    levels = {name: logging.getLogger(name).level for name in names}
    nemo_filters = list(logging.getLogger("nemo_logger").filters)
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    logging.getLogger("nemo_logger").filters[:] = nemo_filters


def warned(message: str, category: type[Warning], module: str = "megatron.core.models.backends") -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_libraries()
        warnings.warn_explicit(message, category, filename="x.py", lineno=1, module=module)
    return bool(caught)


@pytest.mark.usefixtures("restored_logging")
def test_only_the_named_library_warnings_are_silenced():
    assert not warned("Apex is not installed. Falling back to Torch Norm", UserWarning)
    assert not warned("Failed to create unified memory mempool.", UserWarning)
    assert not warned("`torch.cuda.amp.custom_fwd(args...)` is deprecated.", FutureWarning)
    # Lightning's hint on machines with more than two cores (the CLI runs above print it on a 16-core host)
    hint = "The 'predict_dataloader' does not have many workers which may be a bottleneck. Consider increasing"
    assert not warned(hint, PossibleUserWarning, module="lightning.pytorch.utilities.rank_zero")
    # a warning of the same kind with another message, and deprecations bionemo itself raises, still show
    assert warned("The number of training batches (2) is smaller than the logging interval", UserWarning)
    assert warned("setting `foo` is deprecated; use `bar`", FutureWarning, module="bionemo.recipes.settings")
    assert logging.getLogger("megatron.core.utils").getEffectiveLevel() == logging.ERROR
    assert logging.getLogger("lightning.pytorch.utilities.rank_zero").getEffectiveLevel() == logging.WARNING
    record = logging.LogRecord("nemo_logger", logging.INFO, "x.py", 1, "Fixing mis-match", None, None)
    assert not logging.getLogger("nemo_logger").filter(record)
    record.levelno = logging.WARNING
    assert logging.getLogger("nemo_logger").filter(record)


def state() -> tuple:
    levels = [logging.getLogger(name).level for name in ("megatron", "lightning.pytorch.utilities.rank_zero")]
    return list(warnings.filters), levels, logging.getLogger("nemo_logger").filters[:]


def test_verbose_changes_nothing_and_shows_the_import_notes(monkeypatch):
    monkeypatch.setenv(SHOW_IMPORT_NOTES, "")  # restored after the test (delenv of an unset name records nothing)
    before = state()
    quiet_libraries(verbose=True)
    assert state() == before
    assert os.environ[SHOW_IMPORT_NOTES] == "1"  # bionemo's packages then leave megatron's and NeMo's notes
