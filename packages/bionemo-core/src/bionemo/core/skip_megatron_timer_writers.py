"""Work-around: megatron-core imports wandb and TensorBoard for its timers every time it is imported.

Upstream behaviour (megatron-core 0.15.3, ``megatron/core/timers.py``, imported by ``megatron.core`` itself):
at import it runs ``import wandb`` and ``from torch.utils.tensorboard import SummaryWriter``, each falling back to
``None`` on ``ImportError``. They serve one method, ``Timers.write``, which writes timings to a writer Megatron-LM's
own training script passes; NeMo and bionemo never call it. Both are installed with ``nemo-toolkit[core]``, so
every ``bionemo run`` pays for them: about a second on the GPU machines (wandb 0.9 s of a predict's start-up,
docs/benchmarks.md#prediction-start-up).

The work-around: while ``megatron.core.timers`` runs, ``wandb`` and ``torch.utils.tensorboard`` look absent
(``None`` in ``sys.modules``, which makes an import raise ``ImportError``) unless they were imported already, so
megatron takes its own fallback (``wandb = SummaryWriter = None``); the two entries are removed as soon as the
module has run, and a later import (Lightning's ``TensorBoardLogger``, a user's ``import wandb``) imports them as
usual. Only ``Timers.write`` changes: it no longer recognises a writer.

- Applied by :func:`skip_megatron_timer_writers`, called by the ``bionemo`` command (``bionemo.cli.app.main``)
  before anything is imported, on the verified version only; on another version it is not applied and says so
  once (:class:`bionemo.core.skip_unified_memory_build.UnverifiedMegatronWarning`). Importing a bionemo library
  does not apply it.
- Switch: ``BIONEMO_MEGATRON_TIMER_WRITERS=1`` leaves megatron's imports alone.
- Canary: tests/core/test_skip_megatron_timer_writers.py fails when the upstream file changes.
"""

import sys
from collections.abc import Callable
from types import ModuleType

from bionemo.core.module_hook import hook_verified_module
from bionemo.core.skip_unified_memory_build import VERIFIED_MEGATRON_CORE, UnverifiedMegatronWarning

__all__ = ["MODULE", "SWITCH", "UPSTREAM_SHA256", "WRITERS", "skip_megatron_timer_writers"]

MODULE = "megatron.core.timers"
WRITERS = ("wandb", "torch.utils.tensorboard")
"""The modules megatron's timers import for ``Timers.write``, kept absent while they are imported."""
UPSTREAM_SHA256 = "433a769db4d00f3444b2b98416b20dd68505ebbf59f9993334d4765363e4e27e"
"""SHA-256 of the verified version's file (the canary test compares the installed one with it)."""
SWITCH = "BIONEMO_MEGATRON_TIMER_WRITERS"


def skip_megatron_timer_writers() -> bool:
    """Arrange for megatron's timers not to import :data:`WRITERS` when megatron-core is imported; imports nothing.

    Returns:
        ``True`` when the work-around is armed (or was armed before), ``False`` when it is switched off, the module
        was already imported, megatron-core is not installed or not the verified version.
    """
    return hook_verified_module(
        MODULE,
        _run_without_writers,
        distribution="megatron-core",
        verified=VERIFIED_MEGATRON_CORE,
        switch=SWITCH,
        warning=UnverifiedMegatronWarning,
        what="the skip of its timers' wandb and TensorBoard imports",
    )


def _run_without_writers(exec_module: Callable[[ModuleType], None], module: ModuleType) -> None:
    """Runs the module with the :data:`WRITERS` not yet imported looking absent, then forgets that they were."""
    hidden = [name for name in WRITERS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # pyright: ignore[reportArgumentType]  # import raises ImportError
    try:
        exec_module(module)
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]
