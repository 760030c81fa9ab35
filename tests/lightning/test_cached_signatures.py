"""The cached_signatures work-around dispatches NeMo's callbacks and step setup exactly as NeMo does."""

import functools
import inspect
import types

import lightning.pytorch.core.module as lightning_module
import pytest
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from nemo.lightning.megatron_parallel import CallbackConnector, MegatronParallel

from bionemo.lightning.workarounds import Patches, cached_signatures


def recorder_class() -> type:
    """A class (with new functions on each call) of callbacks of every signature kind NeMo's ``event`` tells apart."""

    class Recorder:
        def __init__(self, calls: list) -> None:
            self.calls = calls

        def on_megatron_step_start(self, step, *args, **kwargs):  # *args and **kwargs
            self.calls.append(("both", step, args, kwargs))

        def on_megatron_microbatches_start(self, step, *args, extra=None):  # *args only
            self.calls.append(("args", step, args, extra))

        def on_megatron_microbatch_start(self, step, batch=None, **kwargs):  # **kwargs only
            self.calls.append(("kwargs", step, batch, kwargs))

        def on_megatron_step_end(self, step, reduced=None):  # neither
            self.calls.append(("neither", step, reduced))

    return Recorder


EVENTS = [
    ("on_megatron_step_start", ("s", "extra positional"), {"reduced": 1, "batch": 2}),
    ("on_megatron_microbatches_start", ("s", "p"), {"extra": 3, "unknown": 4}),
    ("on_megatron_microbatch_start", ("s", "b", "dropped"), {"other": 5}),
    ("on_megatron_step_end", ("s",), {"reduced": 6, "unknown": 7}),
    ("on_megatron_step_end", (), {"step": "s", "reduced": 8}),
]


def _dispatch(event, recorder: type) -> list:
    calls: list = []
    connector = CallbackConnector([recorder(calls), recorder(calls)])
    for name, args, kwargs in EVENTS:
        event(connector, name, *args, **kwargs)
    return calls


def test_events_reach_callbacks_with_the_arguments_nemo_passes():
    recorder = recorder_class()
    assert _dispatch(cached_signatures.event, recorder) == _dispatch(CallbackConnector.event, recorder)


def test_each_function_is_inspected_once_and_every_instance_shares_it(monkeypatch):
    inspected = []
    signature = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda f, *a, **k: inspected.append(f) or signature(f, *a, **k))
    recorder = recorder_class()
    first = _dispatch(cached_signatures.event, recorder)
    second = _dispatch(cached_signatures.event, recorder)  # new instances, the same methods
    assert first == second
    assert len(inspected) == len({name for name, _, _ in EVENTS})


def test_one_function_used_bound_and_plain_keeps_both_signatures():
    """A bound method's signature leaves out ``self``: NeMo pairs positional arguments differently for each use."""

    def hook(first=None, second=None, third=None):
        calls.append((type(first).__name__, second, third))

    holder = type("Holder", (), {"on_megatron_step_end": hook})()  # looked up bound: (second, third)
    plain = types.SimpleNamespace(on_megatron_step_end=hook)  # looked up plain: (first, second, third)
    results = []
    for event in (cached_signatures.event, CallbackConnector.event):
        calls: list = []
        connector = CallbackConnector([holder, plain])
        for _ in range(2):
            event(connector, "on_megatron_step_end", "x", "y", "z")
        results.append(calls)
    assert results[0] == results[1] == [("Holder", "x", "y"), ("str", "y", "z")] * 2


class Reduction:
    def __init__(self) -> None:
        self.seen: dict = {}

    def setup(self, batch, tensor=None):
        self.seen = {"batch": batch, "tensor": tensor}


@pytest.mark.parametrize("setup_module", [MegatronParallel._setup_module, cached_signatures._setup_module])
def test_setup_passes_only_the_arguments_setup_names(setup_module):
    reduction = Reduction()
    setup_module(None, reduction, batch=1, model=2, forward_module=3, tensor=4)
    assert reduction.seen == {"batch": 1, "tensor": 4}
    setup_module(None, object())  # nothing to set up: nothing happens


def _decorated(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)

    return wrapper


class Hooks:
    def training_step(self, batch, batch_idx):
        pass

    def iterator_step(self, dataloader_iter):
        pass

    def var_step(self, *args):
        pass

    @_decorated
    def decorated_step(self, batch, dataloader_iter):
        pass


QUESTIONS = [
    {"param": "dataloader_iter", "explicit": True},
    {"param": "dataloader_iter"},
    {"param": "batch_idx", "min_args": 2},
    {"param": "dataloader_idx", "min_args": 3},
]


@pytest.mark.parametrize("hook", ["training_step", "iterator_step", "var_step", "decorated_step"])
def test_hook_signature_answers_as_lightning(hook):
    for holder in (Hooks(), Hooks):  # bound and plain
        for question in QUESTIONS:
            fx = getattr(holder, hook)
            assert cached_signatures.is_param_in_hook_signature(fx, **question) == is_param_in_hook_signature(
                fx, **question
            ), (holder, question)


def test_lightning_log_reads_the_training_step_signature_once(monkeypatch):
    inspected = []
    spec = inspect.getfullargspec
    monkeypatch.setattr(inspect, "getfullargspec", lambda f: inspected.append(f) or spec(f))
    fresh = type("Fresh", (), {"training_step": lambda self, batch, batch_idx: None})  # a function not yet cached
    hooks = [fresh(), fresh()]
    for _ in range(3):
        for instance in hooks:
            assert not cached_signatures.is_param_in_hook_signature(instance.training_step, "dataloader_iter", True)
    assert len(inspected) == 1


def test_install_replaces_all_three_and_restore_puts_upstream_back():
    def lightning_reader():
        return vars(lightning_module)["is_param_in_hook_signature"]  # the name LightningModule.log calls

    originals = CallbackConnector.event, MegatronParallel._setup_module, lightning_reader()
    with Patches() as patches:
        cached_signatures.install(patches)
        cached_signatures.install(patches)  # a second install changes nothing more
        assert len(patches) == 3
        assert CallbackConnector.event is cached_signatures.event
        assert lightning_reader() is cached_signatures.is_param_in_hook_signature
    assert (
        CallbackConnector.event,
        MegatronParallel._setup_module,
        lightning_reader(),
    ) == originals
