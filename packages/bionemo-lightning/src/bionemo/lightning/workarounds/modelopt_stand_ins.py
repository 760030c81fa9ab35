"""Megatron checkpoints with ``nemo_toolkit[core]``: no-op ModelOpt state functions where NeMo's cannot import.

NeMo 2.7.3's ``MegatronStrategy.save_checkpoint`` / ``load_checkpoint`` import
``nemo.collections.llm.modelopt.model_utils`` (the whole LLM collection: HF ``datasets``, ``nemo_run``,
ModelOpt, ...), which fails with ``nemo_toolkit[core]``. A model built by a bionemo config carries no ModelOpt
state, so there is nothing to save or restore: :func:`modelopt_stand_ins` registers stand-in modules whose
``save_modelopt_state`` / ``restore_modelopt_state`` do nothing, for as long as its ``with`` block lasts, and only
when the real module cannot be imported. :func:`checkpoint_with_stand_ins` wraps one strategy's
``save_checkpoint`` / ``load_checkpoint`` in it. That wrapper is an attribute of the trainer's own strategy
object and stays there after teardown (``trainer.save_checkpoint`` after ``fit`` is legitimate); no module or
class is changed, and ``sys.modules`` holds the stand-ins only during a save or load.
"""

import functools
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bionemo.lightning.workarounds.workaround import Patches, Workaround

__all__ = [
    "MODELOPT_STAND_INS",
    "checkpoint_with_stand_ins",
    "modelopt_importable",
    "modelopt_stand_ins",
    "register_stand_ins",
]

MODULE = "nemo.collections.llm.modelopt.model_utils"
_PARENTS = ("nemo.collections.llm", "nemo.collections.llm.modelopt")
_MARK = "_bionemo_modelopt_stand_ins"


@functools.cache
def modelopt_importable() -> bool:
    """Whether NeMo's ``nemo.collections.llm.modelopt.model_utils`` imports here (tried once per process)."""
    if MODULE in sys.modules and not getattr(sys.modules[MODULE], _MARK, False):
        return True
    try:
        __import__(MODULE)
    except ImportError:
        return False
    return True


@contextmanager
def modelopt_stand_ins() -> Iterator[bool]:
    """Inside the block, ``nemo.collections.llm.modelopt.model_utils`` imports: NeMo's, or no-op stand-ins.

    Yields:
        ``True`` when the stand-ins are in use, ``False`` when NeMo's module imports (or one is registered).
    """
    with Patches() as patches:
        yield register_stand_ins(patches)


def register_stand_ins(patches: Patches) -> bool:
    """Put the stand-ins into ``sys.modules`` through ``patches`` unless that module is there or imports.

    Returns:
        ``True`` when registered now.
    """
    if MODULE in sys.modules or modelopt_importable():
        return False
    for parent in _PARENTS:
        if parent not in sys.modules or not hasattr(sys.modules[parent], "__path__"):
            package = types.ModuleType(parent, "bionemo stand-in: the real package cannot be imported")
            package.__path__ = []
            patches.set_item(sys.modules, parent, package)
    module = types.ModuleType(MODULE, "bionemo stand-in: models built by bionemo configs carry no ModelOpt state")
    module.save_modelopt_state = _no_modelopt_state  # type: ignore[attr-defined]
    module.restore_modelopt_state = _no_modelopt_state  # type: ignore[attr-defined]
    setattr(module, _MARK, True)
    patches.set_item(sys.modules, MODULE, module)
    return True


def checkpoint_with_stand_ins(strategy: Any) -> bool:
    """Wrap ``strategy.save_checkpoint`` / ``load_checkpoint`` (this object only) in :func:`modelopt_stand_ins`.

    Returns:
        ``True`` when wrapped now, ``False`` when they already were.
    """
    if getattr(strategy.save_checkpoint, _MARK, False):
        return False
    for name in ("save_checkpoint", "load_checkpoint"):
        setattr(strategy, name, _with_stand_ins(getattr(strategy, name)))
    return True


def _with_stand_ins(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with modelopt_stand_ins():
            return method(*args, **kwargs)

    setattr(call, _MARK, True)
    return call


def _no_modelopt_state(*args: Any, **kwargs: Any) -> None:
    """Save or restore no ModelOpt state (the model has none)."""


MODELOPT_STAND_INS = Workaround(
    name="modelopt_stand_ins",
    upstream="NeMo's MegatronStrategy.save_checkpoint / load_checkpoint import nemo.collections.llm",
    verified={"nemo-toolkit": "2.7.3"},
    sources={
        "nemo.lightning.pytorch.strategies.megatron_strategy:MegatronStrategy.save_checkpoint": "71aa3b85ff98b8c8",
        "nemo.lightning.pytorch.strategies.megatron_strategy:MegatronStrategy.load_checkpoint": "c0a5c81a80e7c687",
    },
)
