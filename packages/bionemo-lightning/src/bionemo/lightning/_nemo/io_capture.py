"""NeMo's record of a module's constructor call (``__io__``), as ``io.IOMixin`` would have captured it.

NeMo reads ``module.__io__`` (a fiddle ``Config`` of the ``__init__`` arguments) for its checkpoint context
(``TrainerContext.io_dump`` in its ``ModelCheckpoint``), ``io.reinit`` and ``io.load_context``;
``OptimizerModule.connect`` and some NeMo callbacks look at it too.
"""

import inspect
from typing import Any

from nemo.lightning.io.mixin import _io_init, _io_register_serialization, _io_transform_args

from bionemo.lightning._init_args import InitCall

__all__ = ["io_config"]

_registered: set[type] = set()


def io_config(module: Any, call: InitCall) -> Any:
    """The fiddle ``Config`` that rebuilds ``module`` from its recorded constructor ``call``.

    Arguments are converted as NeMo converts them (objects with an ``__io__`` become their record, dataclasses
    become configs), and var-keyword arguments (``**model_construct_args``) are stored as named arguments: NeMo
    stores them under their parameter name, so ``io.reinit`` would call ``__init__(..., model_construct_args={...})``
    and nest them one level deeper each round trip.
    """
    cls = type(module)
    if cls not in _registered:  # what IOMixin.__init_subclass__ does: instances serialize as their record
        _io_register_serialization(cls)
        _registered.add(cls)
    captured = _io_transform_args(module, call.init, *call.args, **call.kwargs)
    for name, parameter in inspect.signature(call.init).parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            for key, value in (captured.pop(name, None) or {}).items():
                captured[key] = _io_transform_args(module, _one_argument, value)["value"]
    return _io_init(module, **captured)


def _one_argument(self: Any, value: Any) -> None:
    """A signature with one named argument, for converting a single value through NeMo's capture."""
