"""What a fine-tuned model is, as plain data stored in its ``model.safetensors``: task, head, labels, encoder mode.

Only the standard library is used, so a fine-tuned file is recognised and checked before torch is imported.

A fine-tuned ``model.safetensors`` holds:

- the encoder's tensors under the names of :mod:`bionemo.esm2.checkpoints.weights` without the language-model head
  (:data:`LM_HEAD_PREFIXES`); with LoRA, the base weights unmerged plus each adapted layer's whole factors
  ``<layer>.lora_A.weight`` ``[rank, in]`` and ``<layer>.lora_B.weight`` ``[out, rank]``
  (:func:`bionemo.layers.lora_state_dict`'s layout, e.g. ``decoder.layers.0.self_attention.linear_qkv.lora_A.weight``);
- the head's tensors under :data:`HEAD_PREFIX` (``head.dense.weight``, ...: the head module's own names);
- metadata, JSON per key as every bionemo weights file: ``model`` (the encoder's ``ESM2Config`` settings),
  ``vocab_size``, and :data:`FINETUNE_KEY` holding :meth:`FinetuneSpec.to_json`.
"""

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from bionemo.esm2.finetune.head_config import HeadConfig
from bionemo.esm2.finetune.tasks import LabelVocabulary, Task

__all__ = ["FINETUNE_KEY", "HEAD_PREFIX", "LM_HEAD_PREFIXES", "EncoderMode", "FinetuneSpec", "LoRASettings"]

FINETUNE_KEY = "finetune"
"""The metadata key of a fine-tuned model's :class:`FinetuneSpec` (absent from pretrained weights)."""

HEAD_PREFIX = "head."
"""Names of the head's tensors in a fine-tuned file start with this."""

LM_HEAD_PREFIXES = ("lm_head.", "output_layer.")
"""The language-model head's tensors, which a fine-tuned model does not have (its head replaces them)."""


class EncoderMode(StrEnum):
    """``--encoder``: what fine-tuning trains of the encoder."""

    FULL = "full"
    """Every encoder weight trains with the head."""
    FROZEN = "frozen"
    """Only the head trains, on embeddings computed once per sequence."""
    LORA = "lora"
    """LoRA adapters train with the head; the base weights stay frozen."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LoRASettings:
    """LoRA's shape as stored (``bionemo.layers.LoRAConfig`` without importing it: that module needs torch)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("qkv", "proj", "fc1", "fc2")
    """Short names of ``bionemo.layers.LoRATarget`` members (``qkv``, ``proj``, ``fc1``, ``fc2``)."""

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"rank={self.rank!r}: valid is an integer >= 1")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int | float) or not self.alpha > 0:
            raise ValueError(f"alpha={self.alpha!r}: valid is a number > 0")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout={self.dropout!r}: valid is a number in [0, 1)")
        unknown = sorted(set(self.targets) - set(LORA_TARGETS))
        if unknown or not self.targets:
            raise ValueError(f"targets {list(self.targets)}: valid are one or more of {', '.join(LORA_TARGETS)}")
        object.__setattr__(self, "targets", tuple(t for t in LORA_TARGETS if t in self.targets))

    def lora_config(self) -> Any:
        """The ``bionemo.layers.LoRAConfig`` (imports torch and megatron-core)."""
        from bionemo.layers import LoRAConfig, LoRATarget

        return LoRAConfig(
            rank=self.rank,
            alpha=float(self.alpha),
            dropout=float(self.dropout),
            targets=frozenset(LoRATarget[t.upper()] for t in self.targets),
        )


LORA_TARGETS = ("qkv", "proj", "fc1", "fc2")
"""``--lora-targets`` values: fused query/key/value, attention output projection, the MLP's two linears."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FinetuneSpec:
    """Everything beside the tensors that rebuilds a fine-tuned model and decodes its outputs."""

    task: Task
    head: HeadConfig
    labels: LabelVocabulary
    encoder: EncoderMode = EncoderMode.FULL
    lora: LoRASettings | None = None
    """The adapters' shape (``encoder=lora``), else None."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "task", Task(self.task))
        object.__setattr__(self, "encoder", EncoderMode(self.encoder))
        if (self.encoder is EncoderMode.LORA) != (self.lora is not None):
            raise ValueError(f"lora settings are given exactly when encoder is lora (encoder={self.encoder})")
        if self.labels.task is not self.task:
            raise ValueError(f"labels are for task {self.labels.task}, the model for {self.task}")

    @property
    def num_outputs(self) -> int:
        """The head's output size."""
        return self.labels.num_outputs

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form; :meth:`from_json` reads it back."""
        return {
            "task": str(self.task),
            "head": self.head.to_json(),
            "labels": self.labels.to_json(),
            "encoder": str(self.encoder),
            "lora": None
            if self.lora is None
            else {**dataclasses.asdict(self.lora), "targets": list(self.lora.targets)},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "FinetuneSpec":
        """The spec :meth:`to_json` wrote.

        Raises:
            ValueError: Missing or unknown keys or values (the file was not written by this version).
        """
        try:
            lora = data.get("lora")
            return cls(
                task=Task(data["task"]),
                head=HeadConfig.from_json(dict(data["head"])),
                labels=LabelVocabulary.from_json(dict(data["labels"])),
                encoder=EncoderMode(data.get("encoder", "full")),
                lora=None if lora is None else LoRASettings(**{**lora, "targets": tuple(lora["targets"])}),
            )
        except (KeyError, TypeError) as error:
            raise ValueError(f"fine-tuning metadata is incomplete or malformed: {error!r}") from None
