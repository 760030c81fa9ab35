"""The fixed choices of the run options and the settings error; cheap to import (no pydantic)."""

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "Accelerator",
    "Include",
    "OutputDtype",
    "Precision",
    "SettingsError",
    "StrategyChoice",
    "WriteIntervalChoice",
]


class SettingsError(ValueError):
    """A setting the run cannot use; ``option`` names the command-line option to fix."""

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message)
        self.option = option


class Accelerator(StrEnum):
    """Where to run."""

    AUTO = "auto"
    CPU = "cpu"
    GPU = "gpu"


class StrategyChoice(StrEnum):
    """How to distribute: NeMo's MegatronStrategy (GPUs; TP/PP/CP/DP) or Lightning DDP (CPU or GPU; DP only)."""

    AUTO = "auto"
    MEGATRON = "megatron"
    DDP = "ddp"


class Precision(StrEnum):
    """Numeric precision of training and prediction."""

    FP32 = "32"
    BF16 = "bf16-mixed"
    FP16 = "16-mixed"

    def torch_dtype(self) -> "torch.dtype":
        """The type this precision computes in: bfloat16, float16 or float32 (imports torch on first call)."""
        import torch

        return {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(self, torch.float32)


class Include(StrEnum):
    """What prediction writes besides the sequence ids."""

    EMBEDDINGS = "embeddings"
    LOGITS = "logits"
    PERPLEXITY = "perplexity"
    RESIDUE_EMBEDDINGS = "residue-embeddings"
    CLS = "cls"
    PSEUDO_PERPLEXITY = "pseudo-perplexity"
    CONTACTS = "contacts"


class OutputDtype(StrEnum):
    """Floating-point type of the written embeddings and logits (perplexities stay float32)."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class WriteIntervalChoice(StrEnum):
    """When prediction shards are written."""

    BATCH = "batch"
    EPOCH = "epoch"
