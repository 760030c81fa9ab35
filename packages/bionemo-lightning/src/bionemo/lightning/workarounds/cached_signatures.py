"""Speed-up: NeMo's dispatch of callbacks and step functions inspects each function once, not on every call.

NeMo 2.7.3 reads a function's signature every time it calls one: ``CallbackConnector.event`` runs
``inspect.signature`` for each callback of each megatron event (NeMo's ``MegatronOptimizerModule`` listens to all
13 events of a step of four micro-batches, the data sampler and ``MegatronCompatCallback`` to some), and
``MegatronParallel._setup_module`` runs ``inspect.getfullargspec`` on the loss reduction's ``setup`` for every
micro-batch. Lightning 2.4.0's ``LightningModule.log`` does the same to the module's ``training_step`` on every call
while training (``is_param_in_hook_signature``: NeMo's data sampler and strategy log through it). These were the
largest host cost the module adds over a raw megatron-core loop (figures:
docs/benchmarks.md#module-against-a-raw-megatron-core-loop and docs/benchmarks.md#nemos-callback-events).

:func:`install` replaces the three readers with copies that inspect each function (the function behind a bound method,
so every instance of a class shares it) once while it exists, then pass arguments exactly as NeMo does. Callables
that are neither functions nor bound methods are inspected on every call, as before. Applied under
MegatronStrategy for every stage; restored at teardown. Off: ``MegatronCompatCallback(skip=["cached_signatures"])``.
"""

import inspect
import types
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from bionemo.lightning.workarounds.workaround import Patches, Workaround

__all__ = ["CACHED_SIGNATURES", "callback_parameters", "install", "is_param_in_hook_signature"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class Parameters(NamedTuple):
    """What NeMo's dispatch reads from a signature."""

    positional: tuple[bool, ...]
    """For each parameter in order: whether it takes a positional argument (NeMo pairs arguments with these)."""
    names: frozenset[str]
    var_args: bool
    var_kwargs: bool


def _cached(inspector: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``inspector(callable_)``, kept for the function behind a bound method (or the function itself) while it lives.

    Bound and plain uses of one function are kept apart: a bound method's signature leaves out its first parameter.
    """
    by_function: dict[bool, weakref.WeakKeyDictionary[types.FunctionType, Any]] = {
        bound: weakref.WeakKeyDictionary() for bound in (True, False)
    }

    def lookup(callable_: Any) -> Any:
        bound = isinstance(callable_, types.MethodType)
        function = callable_.__func__ if bound else callable_
        if not isinstance(function, types.FunctionType):
            return inspector(callable_)  # a partial, a callable object: inspected every time, as NeMo does
        found = by_function[bound].get(function)
        if found is None:
            found = by_function[bound][function] = inspector(callable_)
        return found

    return lookup


def _parameters(callable_: Any) -> Parameters:
    parameters = inspect.signature(callable_).parameters.values()
    return Parameters(
        positional=tuple(p.kind in _POSITIONAL for p in parameters),
        names=frozenset(p.name for p in parameters),
        var_args=any(p.kind == p.VAR_POSITIONAL for p in parameters),
        var_kwargs=any(p.kind == p.VAR_KEYWORD for p in parameters),
    )


callback_parameters: Callable[[Any], Parameters] = _cached(_parameters)
"""The :class:`Parameters` of a callback method (the signature of a bound method, without ``self``)."""

_full_arg_spec: Callable[[Any], inspect.FullArgSpec] = _cached(lambda f: inspect.getfullargspec(f))
"""``inspect.getfullargspec`` (looked up per call, so tests can count the inspections), read once per function."""


def event(self: Any, name: str, *args: Any, **kwargs: Any) -> None:
    """``CallbackConnector.event`` with each callback's signature read once."""
    for callback in self.callbacks.get(name, []):
        method = getattr(callback, name, None)
        if not callable(method):
            continue
        spec = callback_parameters(method)
        if not spec.var_args:  # NeMo passes the arguments that pair with a positional parameter
            args_ = [arg for arg, positional in zip(args, spec.positional, strict=False) if positional]
        else:
            args_ = list(args)
        kwargs_ = kwargs if spec.var_kwargs else {k: v for k, v in kwargs.items() if k in spec.names}
        method(*args_, **kwargs_)


def _setup_module(self: Any, function: Any, **kwargs: Any) -> None:
    """``MegatronParallel._setup_module`` with ``function.setup``'s argument names read once."""
    if hasattr(function, "setup"):
        names = _full_arg_spec(function.setup).args
        function.setup(**{k: v for k, v in kwargs.items() if k in names})


def is_param_in_hook_signature(
    hook_fx: Callable[..., Any], param: str, explicit: bool = False, min_args: int | None = None
) -> bool:
    """Lightning's ``is_param_in_hook_signature`` with each hook's argument spec read once."""
    if hasattr(hook_fx, "__wrapped__"):  # a decorated hook
        hook_fx = hook_fx.__wrapped__  # pyright: ignore[reportFunctionMemberAccess]
    parameters = _full_arg_spec(hook_fx)
    args = parameters.args[1:]  # without ``self``
    return (
        param in args
        or (not explicit and parameters.varargs is not None)
        or (isinstance(min_args, int) and len(args) >= min_args)
    )


def install(patches: Patches) -> None:
    """Replace NeMo's two per-call signature readers and the one ``LightningModule.log`` uses (once)."""
    import lightning.pytorch.core.module as lightning_module

    from bionemo.lightning._nemo import CallbackConnector, MegatronParallel

    if CallbackConnector.event is event:
        return
    patches.set(CallbackConnector, "event", event)
    patches.set(MegatronParallel, "_setup_module", _setup_module)
    patches.set(lightning_module, "is_param_in_hook_signature", is_param_in_hook_signature)


CACHED_SIGNATURES = Workaround(
    name="cached_signatures",
    upstream=(
        "NeMo inspects the signature of every callback and step function on every call (inspect.signature); "
        "LightningModule.log inspects training_step on every call"
    ),
    verified={"nemo-toolkit": "2.7.3", "lightning": "2.4.0"},
    sources={
        "nemo.lightning.megatron_parallel:CallbackConnector.event": "8326d1ef99f528b6",
        "nemo.lightning.megatron_parallel:MegatronParallel._setup_module": "b1b3680d8ba23e67",
        "lightning.pytorch.utilities.signature_utils:is_param_in_hook_signature": "6bd4f22c778d7ccc",
        "lightning.pytorch.core.module:LightningModule.log": "917108e8d9600417",
    },
    speed_up=True,
    install=install,
)
