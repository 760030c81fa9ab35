"""Lightning callbacks: perplexity logging, prediction writing and timing."""

from bionemo.callbacks.host_memory import HostMemoryTrim
from bionemo.callbacks.loop_timer import LoopTimer
from bionemo.callbacks.perplexity import PerplexityLoggingCallback
from bionemo.callbacks.prediction_writer import (
    DEFAULT_INDEX_KEY,
    PredictionWriter,
    merge_predictions,
    prediction_files,
)
from bionemo.core.safetensors_io import save_safetensors_atomically

__all__ = [
    "DEFAULT_INDEX_KEY",
    "HostMemoryTrim",
    "LoopTimer",
    "PerplexityLoggingCallback",
    "PredictionWriter",
    "merge_predictions",
    "prediction_files",
    "save_safetensors_atomically",
]
