"""Work-around: Lightning imports TorchDynamo to recognise compiled modules, in every run that compiles none.

Upstream behaviour (lightning 2.4.0): ``lightning/fabric/wrappers.py`` and ``lightning/pytorch/utilities/compile.py``,
both imported by ``import lightning.pytorch``, run ``from torch._dynamo import OptimizedModule`` at import, only to
ask ``isinstance(obj, OptimizedModule)`` of models and collections later (is this the wrapper ``torch.compile``
returns?). Importing ``torch._dynamo`` costs about half a second of a ``bionemo run predict``'s start-up on the CPU
machine, more on the GPU machines (docs/benchmarks.md#prediction-start-up); bionemo compiles no module.

The work-around: those two modules run with that one line importing :class:`OptimizedModule` from here instead, a
stand-in class that answers ``isinstance`` / ``issubclass`` exactly as torch's would: an ``OptimizedModule`` can only
exist once ``torch._dynamo`` is imported (``torch.compile`` imports it), so while it is not, the answer is false, and
once it is, the stand-in asks torch's class. Nothing else in either module changes (the rest of its source, its line
numbers, its other imports); where the line is not found the module runs as upstream's, unchanged.

- Applied by :func:`defer_lightning_dynamo`, called by the ``bionemo`` command (``bionemo.cli.app.main``) before
  anything is imported, on the verified version only; on another version it is not applied and says so once
  (:class:`UnverifiedLightningWarning`). Importing a bionemo library does not apply it.
- Switch: ``BIONEMO_LIGHTNING_DYNAMO_IMPORT=1`` leaves Lightning's imports alone.
- Canary: tests/core/test_defer_lightning_dynamo.py fails when the upstream files change.
"""

from collections.abc import Callable
from types import MappingProxyType, ModuleType

from bionemo.core.module_hook import hook_verified_module, run_with_lines_replaced
from bionemo.core.stand_ins import class_stand_in

__all__ = [
    "LINE",
    "MODULES",
    "SWITCH",
    "UPSTREAM_SHA256",
    "VERIFIED_LIGHTNING",
    "OptimizedModule",
    "UnverifiedLightningWarning",
    "defer_lightning_dynamo",
]

VERIFIED_LIGHTNING = "2.4.0"
MODULES = ("lightning.fabric.wrappers", "lightning.pytorch.utilities.compile")
"""The modules that run with :data:`LINE` replaced."""
UPSTREAM_SHA256 = MappingProxyType(
    {
        "lightning/fabric/wrappers.py": "ee2bb98979cb885b42f72938242aad2a5c6531021e8c0805242ab29361aeab42",
        "lightning/pytorch/utilities/compile.py": "1aaff5c251e0804141af51019a25ef307751690c8bb72e6df6026d0b021b72f4",
    }
)
"""SHA-256 of the verified version's files, by path in the distribution (the canary test checks the installed ones)."""
LINE = "from torch._dynamo import OptimizedModule\n"
"""The upstream line, in both modules; it becomes ``from bionemo.core.defer_lightning_dynamo import OptimizedModule``
(:class:`OptimizedModule`)."""
SWITCH = "BIONEMO_LIGHTNING_DYNAMO_IMPORT"
_DYNAMO = "torch._dynamo"


class UnverifiedLightningWarning(UserWarning):
    """The Lightning work-around was not applied: the installed version is not the one it was verified on."""


OptimizedModule = class_stand_in(_DYNAMO, "OptimizedModule", owner=__name__)
"""Stands in for ``torch._dynamo.OptimizedModule`` in ``isinstance`` / ``issubclass`` (see the module)."""


def defer_lightning_dynamo() -> bool:
    """Arrange for :data:`MODULES` to import the stand-in :class:`OptimizedModule`; imports nothing itself.

    Returns:
        ``True`` when the work-around is armed (or was armed before), ``False`` when it is switched off, a module
        was already imported, Lightning is not installed or not the verified version.
    """
    armed = [
        hook_verified_module(
            name,
            _run_with_stand_in,
            distribution="lightning",
            verified=VERIFIED_LIGHTNING,
            switch=SWITCH,
            warning=UnverifiedLightningWarning,
            what="the deferral of its torch._dynamo import",
        )
        for name in MODULES
    ]
    return all(armed)


def _run_with_stand_in(exec_module: Callable[[ModuleType], None], module: ModuleType) -> None:
    """Runs the module's source with :data:`LINE` importing the stand-in; upstream's code where it is not found."""
    run_with_lines_replaced(exec_module, module, {LINE: f"from {__name__} import OptimizedModule\n"})
