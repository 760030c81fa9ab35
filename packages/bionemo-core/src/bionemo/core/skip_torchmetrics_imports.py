"""Work-around: torchmetrics imports transformers, scipy.signal, matplotlib and regex every time it is imported.

bionemo's commands use none of them. Upstream behaviour (torchmetrics 1.9.0, imported by Lightning itself through
``lightning.pytorch.utilities.types``, so by every ``bionemo run``):

- ``torchmetrics/utilities/imports.py`` sets ``RequirementCache`` flags, true where the package is installed.
  ``_TRANSFORMERS_AVAILABLE`` and ``_TRANSFORMERS_GREATER_EQUAL_4_4`` / ``_4_10`` make
  ``torchmetrics/functional/text/bert.py`` run ``from transformers import AutoModel, AutoTokenizer`` for
  BERTScore's default model (Lightning-AI/torchmetrics#2242): transformers' model and generation code and
  scikit-learn. ``_MATPLOTLIB_AVAILABLE`` makes ``torchmetrics/utilities/plot.py`` import ``matplotlib.pyplot``
  (for ``Metric.plot``), ``_REGEX_AVAILABLE`` makes SacreBLEU's tokenizer import ``regex`` (for its ``intl``
  tokenization), ``_SCIPI_AVAILABLE`` makes ``torchmetrics.audio`` / ``torchmetrics.functional.audio`` import
  ``scipy.signal`` (to give it back ``hamming`` for the SRMR metric) and ``_TORCHVISION_AVAILABLE`` makes the image
  and detection metrics import torchvision's models and ops, which import TorchDynamo (where torchvision is
  installed, as in NVIDIA's PyTorch images: about 1 s of the GPU machine's start-up).
- ``torchmetrics/__init__.py`` imports ``scipy.signal`` for the same ``hamming`` where
  ``lightning_utilities``' ``package_available("scipy")`` is true.

Together about a fifth of a ``bionemo run predict``'s start-up (docs/benchmarks.md#prediction-start-up).

The work-around: while ``torchmetrics/__init__.py`` runs, ``package_available("scipy")`` answers false (every other
package is asked as usual; torchmetrics keeps the real function); when ``torchmetrics.utilities.imports`` has run,
the flags above (:data:`FLAGS`) are replaced by a falsy stand-in whose text says that bionemo skipped the package
and how to switch that off. torchmetrics then takes its own path for a machine without those packages:
BERTScore, InfoLM and the CLIP metrics are not exported and raise torchmetrics' own "requires `transformers`"
``ModuleNotFoundError`` when built with their default model, ``Metric.plot`` raises its "requires matplotlib"
error, SacreBLEU's ``intl`` tokenization its "requires that `regex` is installed" one, the metrics built on
torchvision (LPIPS, ARNIQA, DISTS, the box IoUs, mean AP) their "requires torchvision" ones, and ``scipy.signal`` keeps
its own attributes. Every other flag and metric (regression, classification, the text metrics without a model,
the metrics that import scipy when they run) is torchmetrics' own, and no other module is patched.

- Applied by :func:`skip_torchmetrics_imports`, called by the ``bionemo`` command (``bionemo.cli.app.main``)
  before anything is imported, on the verified version only; on another version it is not applied and says so
  once (:class:`UnverifiedTorchmetricsWarning`). Importing a bionemo library does not apply it: a notebook that
  imports bionemo keeps every torchmetrics metric.
- Switch: ``BIONEMO_TORCHMETRICS_IMPORTS=1`` leaves torchmetrics alone.
- Canary: tests/core/test_skip_torchmetrics_imports.py fails when the upstream files change.
"""

import hashlib
import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType, ModuleType

from bionemo.core.module_hook import hook_module, hook_verified_module

__all__ = [
    "FLAGS",
    "MODULE",
    "PACKAGE",
    "SWITCH",
    "UPSTREAM_SHA256",
    "VERIFIED_TORCHMETRICS",
    "UnverifiedTorchmetricsWarning",
    "skip_torchmetrics_imports",
    "upstream_sha256",
]

PACKAGE = "torchmetrics"
"""The package whose ``__init__`` runs with ``package_available("scipy")`` false."""
MODULE = "torchmetrics.utilities.imports"
"""The module whose :data:`FLAGS` are made falsy."""
FLAGS = MappingProxyType(
    {
        "_TRANSFORMERS_AVAILABLE": "transformers",
        "_TRANSFORMERS_GREATER_EQUAL_4_4": "transformers",
        "_TRANSFORMERS_GREATER_EQUAL_4_10": "transformers",
        "_SCIPI_AVAILABLE": "scipy.signal",
        "_MATPLOTLIB_AVAILABLE": "matplotlib",
        "_REGEX_AVAILABLE": "regex",
        "_TORCHVISION_AVAILABLE": "torchvision",
    }
)
"""Each flag of :data:`MODULE` made falsy, with the module torchmetrics would import where it is true."""
SKIPPED_MODULES = ("transformers", "sklearn", "scipy.signal", "matplotlib", "regex", "torchvision")
"""What the ``bionemo`` command no longer imports through torchmetrics (scikit-learn came with transformers)."""
VERIFIED_TORCHMETRICS = "1.9.0"
UPSTREAM_SHA256 = MappingProxyType(
    {
        "torchmetrics/__init__.py": "3629c0bf415c2e1738acefbc707fc55c1fb4704aaf237f2e64bd2feac624e8bb",
        "torchmetrics/utilities/imports.py": "e7d88f2d2f20e6887dc5cdc0973e540339c59d0ee3f019eed48a09fa39959697",
        "torchmetrics/functional/text/bert.py": "052f6caeec9197de8e83000a1f4428ed3ae22852bd8ba8b2d97aec5d0785ef9f",
        "torchmetrics/audio/__init__.py": "c91beadb130620ebde6525981aa851174d682e9bd67a3fe2c9ce2f9fa510a9ec",
        "torchmetrics/functional/audio/__init__.py": "5a6dd3e18836d55d4f433f0afe8be235ea47dbaa4bc62a4dfdd7285c3c29ff5c",
        "torchmetrics/utilities/plot.py": "0235814255dbc43388a5b55967405d5f0fbe3a1814b29b4604da70b518ec2859",
        "torchmetrics/functional/text/sacre_bleu.py": (
            "8c604571d28f2cf3d11c16156df66253f5aeb7a1b712126523da4d933bd20db1"
        ),
    }
)
"""SHA-256 of the verified version's files, by path in the distribution (the canary test checks the installed ones)."""
SWITCH = "BIONEMO_TORCHMETRICS_IMPORTS"


class UnverifiedTorchmetricsWarning(UserWarning):
    """The torchmetrics work-around was not applied: the installed version is not the one it was verified on."""


def skip_torchmetrics_imports() -> bool:
    """Arrange for torchmetrics not to import :data:`SKIPPED_MODULES` when it is imported; imports nothing itself.

    Returns:
        ``True`` when the work-around is armed (or was armed before), ``False`` when it is switched off,
        torchmetrics was already imported, is not installed or not the verified version.
    """
    armed = hook_verified_module(
        PACKAGE,
        _run_without_scipy,
        distribution="torchmetrics",
        verified=VERIFIED_TORCHMETRICS,
        switch=SWITCH,
        warning=UnverifiedTorchmetricsWarning,
        what=f"the skip of its optional imports ({', '.join(SKIPPED_MODULES)})",
    )
    if armed:  # the version is checked and the package not yet imported, so neither is MODULE
        hook_module(MODULE, _run_then_skip_flags)
    return armed


class _SkippedRequirement:
    """Stands in for a torchmetrics ``RequirementCache``: false, and says why when printed."""

    available = False
    module = None

    def __init__(self, requirement: str, skipped: str) -> None:
        self.requirement = requirement
        self.message = (
            f"Requirement {requirement!r} not checked: bionemo's command keeps torchmetrics from importing "
            f"{skipped} (set {SWITCH}=1 to use torchmetrics' metrics that need it)"
        )

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return self.message


def _run_without_scipy(exec_module: Callable[[ModuleType], None], module: ModuleType) -> None:
    """Runs ``torchmetrics/__init__.py`` with ``package_available("scipy")`` false, then puts the real one back."""
    import lightning_utilities.core.imports as imports

    original = imports.package_available

    def package_available(package_name: str) -> bool:
        return package_name != "scipy" and original(package_name)

    imports.package_available = package_available  # pyright: ignore[reportAttributeAccessIssue]
    try:
        exec_module(module)
    finally:
        imports.package_available = original  # pyright: ignore[reportAttributeAccessIssue]
        if getattr(module, "package_available", None) is package_available:
            module.package_available = original  # pyright: ignore[reportAttributeAccessIssue]  # the real function


def _run_then_skip_flags(exec_module: Callable[[ModuleType], None], module: ModuleType) -> None:
    """Runs the module as upstream does, then replaces :data:`FLAGS` by :class:`_SkippedRequirement`."""
    exec_module(module)
    for name, skipped in FLAGS.items():
        original = getattr(module, name, None)
        requirement = str(getattr(original, "requirement", None) or skipped)
        setattr(module, name, _SkippedRequirement(requirement, skipped))


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
