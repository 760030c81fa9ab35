"""Work-around: importing megatron-core imports torch's DTensor and FSDP packages, which no single-device run uses.

Upstream behaviour (megatron-core 0.15.3): ``megatron.core`` imports ``megatron.core.distributed``, whose package
imports ``TorchFullyShardedDataParallel`` (``torch.distributed.fsdp``) and the Megatron-FSDP adapter, and
``megatron.core.utils`` / ``megatron.core.distributed.finalize_model_grads`` import ``DTensor`` (and ``Shard``,
``distribute_tensor``) only to ask ``isinstance(tensor, DTensor)`` later. ``torch.distributed.tensor`` brings
symbolic shapes and sympy with it: about 1 s of the demo ``bionemo run predict``'s 4.5-5.5 s on the CPU machine
(docs/benchmarks.md#prediction-start-up). A DTensor can only exist once ``torch.distributed.tensor`` is imported,
and FSDP is only set up by code that asks for it by name.

The work-around, one line each, the rest of the source (and its line numbers) upstream's:

- ``megatron.core.utils`` and ``megatron.core.distributed.finalize_model_grads`` import :data:`DTensor`,
  :data:`Shard` and :func:`distribute_tensor` from here: stand-ins answering ``isinstance`` as torch's classes do
  (false while ``torch.distributed.tensor`` is not imported), and a function importing torch's on its first call
  (:mod:`bionemo.core.stand_ins`).
- ``megatron.core.distributed`` gets ``FullyShardedDataParallel`` and ``TorchFullyShardedDataParallel`` on first
  use (:func:`distributed_getattr`, its module ``__getattr__``): ``from megatron.core.distributed import
  TorchFullyShardedDataParallel`` keeps working, and imports FSDP then.

- Applied by :func:`defer_megatron_dtensor`, called by the ``bionemo`` command (``bionemo.cli.app.main``) before
  anything is imported, on the verified version only; on another version it is not applied and says so once
  (:class:`bionemo.core.skip_unified_memory_build.UnverifiedMegatronWarning`). Importing a bionemo library does
  not apply it.
- Switch: ``BIONEMO_MEGATRON_DTENSOR_IMPORT=1`` leaves megatron's imports alone.
- Canary: tests/core/test_defer_megatron_dtensor.py fails when the upstream files change.
"""

import functools
import importlib
import sys
from types import MappingProxyType
from typing import Any

from bionemo.core.module_hook import hook_verified_module, run_with_lines_replaced
from bionemo.core.skip_unified_memory_build import VERIFIED_MEGATRON_CORE, UnverifiedMegatronWarning
from bionemo.core.stand_ins import class_stand_in, function_stand_in

__all__ = [
    "LAZY",
    "LINES",
    "SWITCH",
    "UPSTREAM_SHA256",
    "DTensor",
    "Shard",
    "defer_megatron_dtensor",
    "distribute_tensor",
    "distributed_getattr",
]

_OWN = "from bionemo.core.defer_megatron_dtensor import"
_DISTRIBUTED = "megatron.core.distributed"
LINES = MappingProxyType(
    {
        "megatron.core.utils": {
            "    from torch.distributed._tensor import DTensor\n": f"    {_OWN} DTensor\n",
            "    from torch.distributed.tensor.placement_types import Shard\n": f"    {_OWN} Shard\n",
        },
        "megatron.core.distributed.finalize_model_grads": {
            "    from torch.distributed._tensor import DTensor, distribute_tensor\n": (
                f"    {_OWN} DTensor, distribute_tensor\n"
            ),
        },
        _DISTRIBUTED: {
            "from .fsdp.mcore_fsdp_adapter import FullyShardedDataParallel\n": (
                f"{_OWN} distributed_getattr as __getattr__  # FSDP classes on first use\n"
            ),
            "from .torch_fully_sharded_data_parallel import TorchFullyShardedDataParallel\n": "pass\n",
        },
    }
)
"""By module: each upstream line and the line it becomes."""
UPSTREAM_SHA256 = MappingProxyType(
    {
        "megatron/core/utils.py": "3427606d2bb013a0fd8f0cf2b406373a5bf3e9fd5d99648f393fb17f2d6d5856",
        "megatron/core/distributed/finalize_model_grads.py": (
            "fec7e525298ab11cfe4ff42cbaa8fc09f76654aec73a8a42643deb004bda25b8"
        ),
        "megatron/core/distributed/__init__.py": "884074e2275f9c7d29960498fb9cf30342891f315edf68b5970445a51797db55",
    }
)
"""SHA-256 of the verified version's files, by path in the distribution (the canary test checks the installed ones)."""
LAZY = MappingProxyType(
    {
        "FullyShardedDataParallel": f"{_DISTRIBUTED}.fsdp.mcore_fsdp_adapter",
        "TorchFullyShardedDataParallel": f"{_DISTRIBUTED}.torch_fully_sharded_data_parallel",
    }
)
"""The names ``megatron.core.distributed`` imports on first use, and the module each comes from."""
SWITCH = "BIONEMO_MEGATRON_DTENSOR_IMPORT"

DTensor = class_stand_in("torch.distributed.tensor", "DTensor", owner=__name__)
"""Stands in for ``torch.distributed.tensor.DTensor`` in ``isinstance`` / ``issubclass``."""
Shard = class_stand_in("torch.distributed.tensor.placement_types", "Shard", owner=__name__)
"""Stands in for ``torch.distributed.tensor.placement_types.Shard`` in ``isinstance`` / ``issubclass``."""
distribute_tensor = function_stand_in("torch.distributed.tensor", "distribute_tensor", owner=__name__)


def defer_megatron_dtensor() -> bool:
    """Arrange for the modules of :data:`LINES` to run with their lines replaced; imports nothing itself.

    Returns:
        ``True`` when the work-around is armed (or was armed before), ``False`` when it is switched off, a module
        was already imported, megatron-core is not installed or not the verified version.
    """
    armed = [
        hook_verified_module(
            name,
            functools.partial(run_with_lines_replaced, lines=lines),
            distribution="megatron-core",
            verified=VERIFIED_MEGATRON_CORE,
            switch=SWITCH,
            warning=UnverifiedMegatronWarning,
            what="the deferral of its DTensor and FSDP imports",
        )
        for name, lines in LINES.items()
    ]
    return all(armed)


def distributed_getattr(name: str) -> Any:
    """``megatron.core.distributed.<name>`` for the names of :data:`LAZY`: imported, kept on the package, returned.

    Raises:
        AttributeError: for any other name, as a module without this ``__getattr__`` would.
    """
    if name not in LAZY:
        raise AttributeError(f"module {_DISTRIBUTED!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(LAZY[name]), name)
    setattr(sys.modules[_DISTRIBUTED], name, value)
    return value
