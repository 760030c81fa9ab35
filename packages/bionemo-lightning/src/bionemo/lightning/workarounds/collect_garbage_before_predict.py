"""A garbage collection before prediction, so that forked DataLoader workers find no CUDA tensors left over.

Predicting in the same process after training (2 x H200, torch 2.11 cu130), forked DataLoader workers died
once with a CUDA "initialization error": tensors left from ``fit`` were still waiting for the collector when
the workers forked. :func:`collect_garbage` runs ``gc.collect()`` at predict start; nothing is patched.
"""

import gc

from bionemo.lightning.workarounds.workaround import Workaround

__all__ = ["COLLECT_GARBAGE_BEFORE_PREDICT", "collect_garbage"]


def collect_garbage() -> None:
    """Run the garbage collector (at predict start)."""
    gc.collect()


COLLECT_GARBAGE_BEFORE_PREDICT = Workaround(
    name="collect_garbage_before_predict",
    upstream="forked DataLoader workers died with a CUDA initialization error after fit in the same process",
    verified={"nemo-toolkit": "2.7.3", "lightning": "2.4.0"},
    sources={},  # replaces no upstream code
    stages=frozenset({"predict"}),
)
