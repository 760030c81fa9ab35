"""Regression heads trained on standardized labels, exported in the labels' own units.

A head's last linear layer starts with outputs near 0 and of unit scale. Labels such as melting temperatures
(~40-90) or expression levels are far from that: the head first spends its steps learning their mean and spread, and
the squared error of the first steps is in the thousands, which full fine-tuning back-propagates into the encoder
(measured on the demo model: Spearman 0.11 on a label of mean 44 and sd 3 against 0.73 on the same label
standardized). So regression and token-regression runs train the head on standardized labels: the model's output is
``raw * scale + center``, with ``center`` / ``scale`` the training labels' mean and standard deviation per column
(token-regression: over the scored residues). The loss divides each column's error by its ``scale`` (the squared
error of standardized labels: every column weighs the same), while the metrics and every output stay in the labels'
units. At export :meth:`LabelScaling.fold` folds the two into the head's last linear layer (``W * scale``,
``b * scale + center``), so the exported model (and its Hugging Face export) predicts in the labels' units with no
extra step.
"""

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from bionemo.esm2.finetune.head_config import HeadKind
from bionemo.esm2.finetune.tasks import LabelledRecord, Task

__all__ = ["LAST_LAYER", "LabelScaling"]

LAST_LAYER = {
    HeadKind.HF_SEQUENCE: "head.out_proj",
    HeadKind.MEAN_MLP: "head.out_proj",
    HeadKind.CONV_TOKEN: "head.classifier",
    HeadKind.HF_TOKEN: "head.classifier",
}
"""Each head's last linear layer (its outputs are the model's), as named in a fine-tuned file."""


@dataclass(frozen=True)
class LabelScaling:
    """Model outputs = head outputs * ``scale`` + ``center``, per output column."""

    center: tuple[float, ...]
    scale: tuple[float, ...]
    _on_device: dict[Any, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_records(cls, task: Task, records: Sequence[LabelledRecord]) -> "LabelScaling | None":
        """The training labels' mean and standard deviation per column (regression tasks), else None.

        Token-regression pools the scored residues of every record. A column whose labels are all equal gets scale 1.
        """
        task = Task(task)
        if task is Task.REGRESSION:
            columns = [[float(v) for v in values] for values in zip(*(r.labels for r in records), strict=True)]
        elif task is Task.TOKEN_REGRESSION:
            scored = (
                float(v)
                for r in records
                for i, v in enumerate(r.labels)
                if r.mask is None or r.mask[i]  # type: ignore[index]
            )
            columns = [list(scored)]
        else:
            return None
        center, scale = [], []
        for values in columns:
            mean = math.fsum(values) / len(values)
            sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
            center.append(mean)
            scale.append(sd if sd > 0 else 1.0)
        return cls(tuple(center), tuple(scale))

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, center)`` as float32 ``[k]`` tensors on ``device``, copied there once.

        Kept here rather than as module buffers, which a bf16 cast of the model would round; copied once, because a
        copy from the host in every step would make the host wait for the device.
        """
        if device not in self._on_device:
            self._on_device[device] = (
                torch.tensor(self.scale, dtype=torch.float32, device=device),
                torch.tensor(self.center, dtype=torch.float32, device=device),
            )
        return self._on_device[device]

    def apply(self, outputs: torch.Tensor) -> torch.Tensor:
        """``outputs [..., k]`` * scale + center, in float32 (a bf16 output keeps its resolution near 0)."""
        scale, center = self.on(outputs.device)
        return torch.addcmul(center, outputs.float(), scale)

    def fold(self, tensors: Mapping[str, torch.Tensor], head: HeadKind) -> dict[str, torch.Tensor]:
        """``tensors`` with the scaling folded into the head's last linear layer: its outputs are then the model's.

        The layer's weight rows and bias are computed in float32 and stored in the layer's own dtype.
        """
        layer = LAST_LAYER[HeadKind(head)]
        weight, bias = tensors[f"{layer}.weight"], tensors[f"{layer}.bias"]
        scale = torch.tensor(self.scale, dtype=torch.float32, device=weight.device)
        center = torch.tensor(self.center, dtype=torch.float32, device=weight.device)
        folded = dict(tensors)
        folded[f"{layer}.weight"] = (weight.float() * scale[:, None]).to(weight.dtype)
        folded[f"{layer}.bias"] = (bias.float() * scale + center).to(bias.dtype)
        return folded

    def to_json(self) -> str:
        """A JSON string; :meth:`from_json` reads it back."""
        return json.dumps({"center": list(self.center), "scale": list(self.scale)})

    @classmethod
    def from_json(cls, text: str) -> "LabelScaling | None":
        """The scaling :meth:`to_json` wrote, or None for ``"null"``.

        One object per text: the model and its loss reductions share one copy of it on the device.
        """
        return _from_json(text)


@functools.cache
def _from_json(text: str) -> LabelScaling | None:
    data = json.loads(text)
    return None if data is None else LabelScaling(tuple(data["center"]), tuple(data["scale"]))
