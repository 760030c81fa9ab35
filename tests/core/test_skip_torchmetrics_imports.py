"""torchmetrics imports no transformers, scipy.signal, matplotlib or regex in the ``bionemo`` command.

(bionemo.core.skip_torchmetrics_imports)
"""

import importlib.metadata
import importlib.util
import os
import sys
import textwrap
import warnings
from types import ModuleType

import pytest
import torch

import bionemo.core.skip_torchmetrics_imports as skip
from bionemo.core.module_hook import module_hooked
from bionemo.core.skip_torchmetrics_imports import (
    FLAGS,
    MODULE,
    PACKAGE,
    SKIPPED_MODULES,
    SWITCH,
    UPSTREAM_SHA256,
    VERIFIED_TORCHMETRICS,
    UnverifiedTorchmetricsWarning,
    skip_torchmetrics_imports,
    upstream_sha256,
)
from support.import_hooks import clean_meta_path as clean_hooks
from support.import_hooks import run_bionemo_probe as probe

PREDS = [0.1, 0.9, 0.35, 0.8, 0.45, 0.2, 0.7, 0.6]
VALUES = [0.3, 1.2, -0.4, 0.9, 0.2, -1.0, 0.5, 1.5]  # regression target, no ties
LABELS = [0, 1, 0, 1, 1, 0, 0, 1]  # binary target

# A clean process running the real `bionemo` entry point with a command added to its app: the command reports
# whether the work-around was armed before it ran, imports Lightning, computes three of the torchmetrics metrics
# bionemo's fine-tuning logs, and reports what torchmetrics made of the packages it skips.
CHILD = textwrap.dedent(
    f"""
    import json, sys
    import typer
    from bionemo.cli import app as cli
    from bionemo.core.module_hook import module_hooked
    from bionemo.core.skip_torchmetrics_imports import FLAGS, MODULE, PACKAGE, SKIPPED_MODULES

    def armed():
        return int(module_hooked(PACKAGE)) + int(module_hooked(MODULE))

    @cli.app.command("probe")
    def probe() -> None:
        armed_before = armed()
        import lightning.pytorch
        import torch
        import lightning_utilities.core.imports as lightning_imports
        import torchmetrics
        import torchmetrics.functional.text.bert as bert
        import torchmetrics.text
        import torchmetrics.utilities.imports as flags
        from torchmetrics.classification import BinaryAUROC
        from torchmetrics.functional import pearson_corrcoef, spearman_corrcoef

        preds, values, labels = torch.tensor({PREDS!r}), torch.tensor({VALUES!r}), torch.tensor({LABELS!r})
        bert_error = ""
        if not flags._TRANSFORMERS_GREATER_EQUAL_4_4:  # otherwise it would download BERTScore's default model
            try:
                bert.bert_score(["a"], ["a"])
            except ModuleNotFoundError as error:
                bert_error = str(error)
        print(json.dumps({{
            "armed_before": armed_before,
            "finders_left": armed(),
            "imported": [name in sys.modules for name in SKIPPED_MODULES],
            "flags": [bool(getattr(flags, name)) for name in FLAGS],
            "real_package_available": torchmetrics.package_available is lightning_imports.package_available,
            "scipy_available": lightning_imports.package_available("scipy"),
            "flag_text": str(flags._TRANSFORMERS_GREATER_EQUAL_4_4),
            "bertscore_exported": hasattr(torchmetrics.text, "BERTScore"),
            "bert_error": bert_error,
            "pearson": pearson_corrcoef(preds, values).item(),
            "spearman": spearman_corrcoef(preds, values).item(),
            "auroc": BinaryAUROC()(preds, labels).item(),
        }}))
        raise typer.Exit(0)

    sys.argv = ["bionemo", "probe"]
    cli.main()
    """
)


def run_bionemo_probe(value: str | None) -> dict:
    return probe(CHILD, SWITCH, value)


def installed(module: str) -> bool:
    """Whether ``module``'s top-level package is installed here (torchvision is on NVIDIA's images, not in the lock)."""
    return importlib.util.find_spec(module.split(".")[0]) is not None


def reference_metrics() -> dict[str, float]:
    """Pearson, Spearman (no ties: Pearson of the ranks) and AUROC (share of positive/negative pairs in order)."""
    preds, values, labels = (torch.tensor(x, dtype=torch.float64) for x in (PREDS, VALUES, LABELS))

    def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
        x, y = x - x.mean(), y - y.mean()
        return (x @ y / (x.norm() * y.norm())).item()

    def ranks(x: torch.Tensor) -> torch.Tensor:
        return x.argsort().argsort().double()

    positives, negatives = preds[labels == 1], preds[labels == 0]
    auroc = (positives[:, None] > negatives[None, :]).double().mean().item()
    return {"pearson": pearson(preds, values), "spearman": pearson(ranks(preds), ranks(values)), "auroc": auroc}


def test_canary_the_installed_upstream_files_are_the_verified_ones():
    """Fails when torchmetrics changes: re-verify the work-around (or drop it) and update the digests."""
    assert importlib.metadata.version("torchmetrics").split("+")[0] == VERIFIED_TORCHMETRICS
    assert upstream_sha256() == dict(UPSTREAM_SHA256)


def test_the_command_arms_it_and_lightning_comes_without_the_skipped_packages():
    report = run_bionemo_probe(None)
    assert report["armed_before"] == 2  # bionemo.cli.app.main armed both hooks before the command ran
    assert report["finders_left"] == 0  # one module, once: the finders are gone after use
    assert report["imported"] == [False] * len(SKIPPED_MODULES)
    assert report["flags"] == [False] * len(FLAGS)
    assert (report["real_package_available"], report["scipy_available"]) == (True, True)  # nothing stays patched
    assert SWITCH in report["flag_text"]  # says who skipped it and how to switch that off
    assert report["bertscore_exported"] is False  # torchmetrics' own path for a machine without transformers
    assert "requires `transformers`" in report["bert_error"]  # and its own error
    assert {name: report[name] for name in ("pearson", "spearman", "auroc")} == pytest.approx(
        reference_metrics(), abs=1e-6
    )


def test_switched_off_torchmetrics_imports_them_as_upstream_does():
    report = run_bionemo_probe("1")
    assert report["armed_before"] == 0
    assert report["imported"] == [installed(name) for name in SKIPPED_MODULES]
    assert report["flags"] == [installed(name) for name in FLAGS.values()]
    assert report["imported"].count(True) >= 4  # transformers, scikit-learn, scipy, regex are in the lock
    assert report["bertscore_exported"] is True
    assert {name: report[name] for name in ("pearson", "spearman", "auroc")} == pytest.approx(
        reference_metrics(), abs=1e-6
    )


@pytest.fixture
def clean_meta_path(monkeypatch):
    return clean_hooks(monkeypatch, SWITCH, PACKAGE, MODULE)


def test_already_imported_torchmetrics_is_left_alone(monkeypatch, clean_meta_path):
    for name in (PACKAGE, MODULE):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or ModuleType(name))
    assert skip_torchmetrics_imports() is False
    assert sys.meta_path == clean_meta_path


def test_importing_bionemo_libraries_does_not_arm_it():
    import bionemo.cli.app  # noqa: F401 - the module, not the command's entry point
    from bionemo.core.megatron_env import prepare_megatron_import

    prepare_megatron_import()
    assert not module_hooked(PACKAGE)
    assert not module_hooked(MODULE)


def test_another_version_is_left_alone_and_said_once(monkeypatch, clean_meta_path):
    for name in (PACKAGE, MODULE):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(skip.importlib.metadata, "version", lambda name: "1.99.0")
    with pytest.warns(UnverifiedTorchmetricsWarning, match="torchmetrics 1.99.0 is installed"):
        assert skip_torchmetrics_imports() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert skip_torchmetrics_imports() is False  # once per process
    assert sys.meta_path == clean_meta_path


def test_an_installed_torchvision_is_not_imported(tmp_path, monkeypatch):
    """NVIDIA's PyTorch images have torchvision; torchmetrics' image metrics would import it (and TorchDynamo)."""
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('torchvision was imported')\n")
    metadata = tmp_path / "torchvision-0.0.1.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.0.1\n")
    (metadata / "RECORD").write_text("torchvision/__init__.py,,\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    report = run_bionemo_probe(None)  # the probe fails if torchvision is imported
    assert report["imported"] == [False] * len(SKIPPED_MODULES)
    assert report["flags"] == [False] * len(FLAGS)
