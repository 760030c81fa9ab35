"""Speed-up: Lightning's per-``log`` move of a logged metric is skipped when it already is on the value's device.

NeMo logs six to eight scalars per training step through ``LightningModule.log`` (global step, loss, learning
rate, consumed samples, ...). Lightning 2.4.0's ``_ResultCollection.log`` moves the stored metric to the value's
device on every call (``_ResultMetric.to``), walking all of its attributes, several times the cost of the call
without it (docs/benchmarks.md#one-selflog-call); :func:`install` skips the walk for a metric already on that
device; the first call, or one with a value on
another device, still moves. Logged values are identical. Applied under MegatronStrategy for every stage;
restored at teardown. Off: ``MegatronCompatCallback(skip=["fast_metric_to"])``.
"""

import functools
from typing import Any

import torch

from bionemo.lightning.workarounds.workaround import Patches, Workaround

__all__ = ["FAST_METRIC_TO", "install"]


def install(patches: Patches) -> None:
    """Wrap Lightning's ``_ResultMetric.to`` through ``patches`` (once)."""
    from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultMetric

    original = _ResultMetric.to
    if getattr(original, "_bionemo_fast", False):
        return

    @functools.wraps(original)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        device = args[0] if len(args) == 1 and not kwargs else None
        state = self.__dict__
        value, count = state.get("value"), state.get("cumulated_batch_size")
        if (
            isinstance(device, str | torch.device)
            and isinstance(value, torch.Tensor)
            and value.device == torch.device(device)
            and (not isinstance(count, torch.Tensor) or count.device == value.device)
        ):
            return self
        return original(self, *args, **kwargs)

    to._bionemo_fast = True  # type: ignore[attr-defined]
    patches.set(_ResultMetric, "to", to)


FAST_METRIC_TO = Workaround(
    name="fast_metric_to",
    upstream="Lightning moves every logged metric to the value's device on each log call, walking all its attributes",
    verified={"lightning": "2.4.0"},
    sources={
        "lightning.pytorch.trainer.connectors.logger_connector.result:_ResultMetric.to": "f45ccd7696961427",
        "lightning.pytorch.trainer.connectors.logger_connector.result:_ResultCollection.log": "bbd506916e32acfd",
    },
    speed_up=True,
    install=install,
)
