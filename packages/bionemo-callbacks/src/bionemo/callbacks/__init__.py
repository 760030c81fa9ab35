"""Lightning callbacks: perplexity logging and prediction writing."""

from bionemo.callbacks.perplexity import PerplexityLoggingCallback
from bionemo.callbacks.prediction_writer import (
    DEFAULT_INDEX_KEY,
    PredictionWriter,
    merge_predictions,
    prediction_files,
)
from bionemo.callbacks.safetensors_io import save_safetensors_atomically

__all__ = [
    "DEFAULT_INDEX_KEY",
    "PerplexityLoggingCallback",
    "PredictionWriter",
    "merge_predictions",
    "prediction_files",
    "save_safetensors_atomically",
]
