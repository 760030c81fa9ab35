"""Each instance's constructor call, recorded without NeMo, for NeMo's record of it (``__io__``) when needed.

NeMo's ``io.IOMixin`` captures a module's ``__init__`` arguments (its checkpoint context, ``io.reinit``) but
importing it loads NeMo. :func:`record_init_calls` only remembers the outermost ``__init__`` call of each instance;
:mod:`bionemo.lightning._nemo.io_capture` turns it into NeMo's record.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

__all__ = ["InitCall", "init_call", "record_init_calls"]

_INIT_CALL = "_bionemo_init_call"
_RECORDS = "_bionemo_records_init_call"


@dataclasses.dataclass(frozen=True, slots=True)
class InitCall:
    """One constructor call: the class whose ``__init__`` ran first, and its arguments (``self`` left out)."""

    owner: type
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    @property
    def init(self) -> Callable[..., None]:
        """The owner's own ``__init__``, unwrapped (its signature binds ``args`` and ``kwargs``)."""
        return self.owner.__dict__["__init__"].__wrapped__


def record_init_calls(cls: type, on_record: Callable[[Any], None] | None = None) -> None:
    """Wrap ``cls``'s own ``__init__`` (if it has one) to record the outermost call per instance.

    ``on_record(instance)`` runs right after the record is made, before ``__init__`` itself runs.
    """
    init = cls.__dict__.get("__init__")
    if init is None or getattr(init, _RECORDS, False):
        return

    @functools.wraps(init)
    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        if _INIT_CALL not in self.__dict__:  # not a super().__init__ call of a subclass's
            self.__dict__[_INIT_CALL] = InitCall(cls, args, kwargs)
            if on_record is not None:
                on_record(self)
        init(self, *args, **kwargs)

    setattr(recording_init, _RECORDS, True)
    cls.__init__ = recording_init  # type: ignore[misc]


def init_call(instance: object) -> InitCall:
    """The constructor call recorded for ``instance``.

    Raises:
        RuntimeError: When none was recorded (its class was not passed to :func:`record_init_calls`).
    """
    call = instance.__dict__.get(_INIT_CALL)
    if call is None:
        raise RuntimeError(f"no constructor call was recorded for this {type(instance).__name__}")
    return call
