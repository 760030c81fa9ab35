"""Work-around: torchmetrics imports transformers every time it is imported; bionemo's CLI never uses it.

Upstream behaviour (torchmetrics 1.9.0, imported by Lightning itself through ``lightning.pytorch.utilities.types``):
``torchmetrics/utilities/imports.py`` sets ``_TRANSFORMERS_AVAILABLE``, ``_TRANSFORMERS_GREATER_EQUAL_4_4`` and
``_TRANSFORMERS_GREATER_EQUAL_4_10`` (``RequirementCache`` objects, true where transformers is installed), and
``torchmetrics/functional/text/bert.py`` then runs ``from transformers import AutoModel, AutoTokenizer`` at import
for BERTScore's default model (Lightning-AI/torchmetrics#2242), which pulls in transformers' model and generation
code and scikit-learn: a large share of Lightning's import time, on every ``bionemo run`` start
(docs/benchmarks.md#prediction-start-up). Only the text and multimodal metrics that load a transformers model need
it (BERTScore, InfoLM, CLIPScore, CLIP-IQA); bionemo uses none of them.

The work-around: when ``torchmetrics.utilities.imports`` has run, those three flags are replaced by a falsy stand-in
whose text says that bionemo skipped transformers and how to switch that off. torchmetrics then takes its own
path for a machine without transformers: ``bert.py`` imports nothing, ``torchmetrics.text`` /
``torchmetrics.functional.text`` / ``torchmetrics.multimodal`` do not export BERTScore, InfoLM and the CLIP
metrics, and building one of those with its default model raises torchmetrics' own "requires `transformers`"
``ModuleNotFoundError``. Nothing else is touched: every other flag and metric (regression, classification, the
text metrics without a model) is torchmetrics' own, and no other module is patched.

- Applied by :func:`skip_torchmetrics_transformers`, called by the ``bionemo`` command (``bionemo.cli.app.main``)
  before anything is imported, on the verified version only; on another version it is not applied and says so
  once (:class:`UnverifiedTorchmetricsWarning`). Importing a bionemo library does not apply it: a notebook that
  imports bionemo keeps every torchmetrics metric.
- Switch: ``BIONEMO_TORCHMETRICS_TRANSFORMERS=1`` leaves torchmetrics alone.
- Canary: tests/core/test_skip_torchmetrics_transformers.py fails when the upstream files change.
"""

import hashlib
import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType, ModuleType

from bionemo.core.module_hook import hook_verified_module

__all__ = [
    "FLAGS",
    "MODULE",
    "SWITCH",
    "UPSTREAM_SHA256",
    "VERIFIED_TORCHMETRICS",
    "UnverifiedTorchmetricsWarning",
    "skip_torchmetrics_transformers",
    "upstream_sha256",
]

MODULE = "torchmetrics.utilities.imports"
FLAGS = ("_TRANSFORMERS_AVAILABLE", "_TRANSFORMERS_GREATER_EQUAL_4_4", "_TRANSFORMERS_GREATER_EQUAL_4_10")
"""The flags of :data:`MODULE` that are made falsy."""
VERIFIED_TORCHMETRICS = "1.9.0"
UPSTREAM_SHA256 = MappingProxyType(
    {
        "torchmetrics/utilities/imports.py": "e7d88f2d2f20e6887dc5cdc0973e540339c59d0ee3f019eed48a09fa39959697",
        "torchmetrics/functional/text/bert.py": "052f6caeec9197de8e83000a1f4428ed3ae22852bd8ba8b2d97aec5d0785ef9f",
    }
)
"""SHA-256 of the verified version's files, by path in the distribution (the canary test checks the installed ones)."""
SWITCH = "BIONEMO_TORCHMETRICS_TRANSFORMERS"


class UnverifiedTorchmetricsWarning(UserWarning):
    """The torchmetrics work-around was not applied: the installed version is not the one it was verified on."""


def skip_torchmetrics_transformers() -> bool:
    """Arrange for torchmetrics not to import transformers when it is imported; imports nothing itself.

    Returns:
        ``True`` when the work-around is armed (or was armed before), ``False`` when it is switched off,
        torchmetrics was already imported, is not installed or not the verified version.
    """
    return hook_verified_module(
        MODULE,
        _run_then_skip_flags,
        distribution="torchmetrics",
        verified=VERIFIED_TORCHMETRICS,
        switch=SWITCH,
        warning=UnverifiedTorchmetricsWarning,
        what="the skip of its transformers import (importing Lightning also imports transformers)",
    )


class _SkippedRequirement:
    """Stands in for a torchmetrics ``RequirementCache`` on transformers: false, and says why when printed."""

    available = False
    module = None

    def __init__(self, requirement: str) -> None:
        self.requirement = requirement
        self.message = (
            f"Requirement {requirement!r} not checked: bionemo's command keeps torchmetrics from importing "
            f"transformers (set {SWITCH}=1 to use torchmetrics' transformers metrics)"
        )

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return self.message


def _run_then_skip_flags(exec_module: Callable[[ModuleType], None], module: ModuleType) -> None:
    """Runs the module as upstream does, then replaces its transformers flags by :class:`_SkippedRequirement`."""
    exec_module(module)
    for name in FLAGS:
        original = getattr(module, name, None)
        setattr(module, name, _SkippedRequirement(str(getattr(original, "requirement", None) or "transformers")))


def upstream_sha256() -> dict[str, str | None]:
    """SHA-256 of each installed :data:`UPSTREAM_SHA256` file (``None`` if absent), found without importing it."""
    try:
        distribution = importlib.metadata.distribution("torchmetrics")
    except importlib.metadata.PackageNotFoundError:
        return dict.fromkeys(UPSTREAM_SHA256)
    found: dict[str, str | None] = {}
    for name in UPSTREAM_SHA256:
        try:
            found[name] = hashlib.sha256(Path(str(distribution.locate_file(name))).read_bytes()).hexdigest()
        except OSError:
            found[name] = None
    return found
