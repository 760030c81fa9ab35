"""Which prediction head a fine-tuned model has, as plain data: chosen on the command line, stored in the model file.

Only the standard library is used, so the CLI refuses a head that cannot do the task before it imports torch;
:mod:`bionemo.esm2.finetune.heads` builds the modules.
"""

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from bionemo.esm2.finetune.tasks import OptionError, Task

__all__ = [
    "HEADS_EXPORTABLE_TO_HF",
    "HEADS_FOR_TASK",
    "HeadChoice",
    "HeadConfig",
    "HeadKind",
    "head_config",
]


class HeadChoice(StrEnum):
    """``--head``: what the user picks; with the task it decides the :class:`HeadKind`."""

    HF = "hf"
    """Hugging Face's layout: ``EsmForSequenceClassification``'s head, or ``EsmForTokenClassification``'s."""
    MLP = "mlp"
    """Mean over the residues, then an MLP (sequence tasks)."""
    CONV = "conv"
    """A 1-D convolution over the residues, then a linear layer (token tasks)."""


class HeadKind(StrEnum):
    """The head's module (:func:`bionemo.esm2.finetune.heads.build_head`)."""

    HF_SEQUENCE = "hf-sequence"
    HF_TOKEN = "hf-token"
    MEAN_MLP = "mean-mlp"
    CONV_TOKEN = "conv-token"

    @property
    def per_residue(self) -> bool:
        """True for heads that output one prediction per position."""
        return self in (HeadKind.HF_TOKEN, HeadKind.CONV_TOKEN)


HEADS_FOR_TASK: dict[Task, dict[HeadChoice, HeadKind]] = {
    Task.REGRESSION: {HeadChoice.HF: HeadKind.HF_SEQUENCE, HeadChoice.MLP: HeadKind.MEAN_MLP},
    Task.CLASSIFICATION: {HeadChoice.HF: HeadKind.HF_SEQUENCE, HeadChoice.MLP: HeadKind.MEAN_MLP},
    Task.MULTILABEL: {HeadChoice.HF: HeadKind.HF_SEQUENCE, HeadChoice.MLP: HeadKind.MEAN_MLP},
    Task.TOKEN_CLASSIFICATION: {HeadChoice.HF: HeadKind.HF_TOKEN, HeadChoice.CONV: HeadKind.CONV_TOKEN},
    Task.TOKEN_REGRESSION: {HeadChoice.CONV: HeadKind.CONV_TOKEN},
}
"""The heads each task can use. ``hf`` has no token-regression: ``EsmForTokenClassification`` always classifies."""

HEADS_EXPORTABLE_TO_HF: frozenset[HeadKind] = frozenset({HeadKind.HF_SEQUENCE, HeadKind.HF_TOKEN})
"""Heads whose weights map 1:1 onto transformers' ``EsmFor{Sequence,Token}Classification`` (``convert to-hf``)."""

_DEFAULT_HIDDEN = {HeadKind.MEAN_MLP: 256, HeadKind.CONV_TOKEN: 32}
_DEFAULT_DROPOUT = {
    HeadKind.HF_SEQUENCE: 0.1,
    HeadKind.HF_TOKEN: 0.1,
    HeadKind.MEAN_MLP: 0.25,
    HeadKind.CONV_TOKEN: 0.25,
}


@dataclass(kw_only=True, slots=True)
class HeadConfig:
    """A head's kind and sizes: everything needed to rebuild it beside the encoder's hidden size and the labels."""

    kind: HeadKind
    """The module (:class:`HeadKind`)."""
    hidden_size: int | None = None
    """The MLP's hidden width (``mean-mlp``, default 256) or the convolution's channels (``conv-token``,
    default 32); None for the ``hf`` heads, whose width is the encoder's."""
    dropout: float | None = None
    """Dropout probability in the head (default: 0.1 for ``hf`` as Hugging Face's ``hidden_dropout_prob``,
    0.25 for the others as bionemo-esm2's heads)."""
    kernel_size: int | None = None
    """The convolution's width in residues, odd so it is centred (``conv-token`` only, default 7)."""

    def __post_init__(self) -> None:
        self.kind = HeadKind(self.kind)
        if self.dropout is None:
            self.dropout = _DEFAULT_DROPOUT[self.kind]
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")
        if self.kind in _DEFAULT_HIDDEN:
            if self.hidden_size is None:
                self.hidden_size = _DEFAULT_HIDDEN[self.kind]
            if self.hidden_size < 1:
                raise ValueError(f"hidden_size must be a positive integer, got {self.hidden_size}")
        elif self.hidden_size is not None:
            raise ValueError(f"hidden_size: the {self.kind} head's width is the encoder's; leave it unset")
        if self.kind is HeadKind.CONV_TOKEN:
            if self.kernel_size is None:
                self.kernel_size = 7
            if self.kernel_size < 1 or self.kernel_size % 2 == 0:
                raise ValueError(f"kernel_size must be a positive odd integer, got {self.kernel_size}")
        elif self.kernel_size is not None:
            raise ValueError(f"kernel_size applies to the {HeadKind.CONV_TOKEN} head only, not {self.kind}")

    @property
    def exportable_to_hf(self) -> bool:
        """Whether ``convert to-hf`` can write this head (:data:`HEADS_EXPORTABLE_TO_HF`)."""
        return self.kind in HEADS_EXPORTABLE_TO_HF

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form (for the model file's metadata); :meth:`from_json` reads it back."""
        return {**dataclasses.asdict(self), "kind": str(self.kind)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "HeadConfig":
        """The config :meth:`to_json` wrote.

        Raises:
            ValueError: Unknown keys or values (a model file from another version).
        """
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"head config has unknown keys {unknown}")
        return cls(**data)


def head_config(task: Task, choice: HeadChoice, **sizes: Any) -> HeadConfig:
    """The head config for ``--head choice`` on ``task`` (``sizes``: :class:`HeadConfig`'s optional fields).

    Raises:
        OptionError: A head the task cannot use (``--head``); the message lists those it can.
    """
    task, choice = Task(task), HeadChoice(choice)
    valid = HEADS_FOR_TASK[task]
    if choice not in valid:
        why = " (EsmForTokenClassification has no regression)" if choice is HeadChoice.HF else ""
        raise OptionError(
            f"--head {choice} cannot do --task {task}{why}; valid for {task}: {', '.join(map(str, valid))}", "--head"
        )
    return HeadConfig(kind=valid[choice], **sizes)
