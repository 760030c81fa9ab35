"""Type variables and the step contracts shared by every bionemo package.

The two step contracts are the ones NeMo's ``MegatronStrategy`` calls on a LightningModule:

* a :data:`DataStep` pulls the next micro-batch out of the dataloader iterator and returns it ready for
  the model (moved to the right device, split for context parallelism, ...);
* a :data:`ForwardStep` runs the model on one such micro-batch and returns the model's raw output, which a
  loss reduction then turns into a loss.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

import torch

__all__ = [
    "DataStep",
    "DataT",
    "ForwardStep",
    "LossT",
    "ModelT",
    "NestedTensors",
    "ReductionT",
]

NestedTensors: TypeAlias = torch.Tensor | Mapping[str, "NestedTensors"] | Sequence["NestedTensors"] | None
"""A tensor, or dicts / lists / tuples of them to any depth; the shape of batches and model outputs."""

DataT = TypeVar("DataT", torch.Tensor, dict[str, torch.Tensor], tuple[torch.Tensor, ...], list[torch.Tensor])
"""A batch or model output: a tensor, a dict of tensors, or a tuple/list of tensors."""

ReductionT = TypeVar("ReductionT")
"""What a loss reduction's ``forward`` hands to its ``reduce`` for one micro-batch."""

ModelT = TypeVar("ModelT", bound=torch.nn.Module)
"""The model a config builds."""

LossT = TypeVar("LossT")
"""The loss reduction class a trainable config names."""

DataStep: TypeAlias = Callable[[Iterator[Any]], Any]
"""``data_step(dataloader_iter) -> batch``.

Takes the dataloader iterator, consumes exactly one micro-batch from it and returns that micro-batch in the
form the forward step expects (a ``DataT``: tensor, dict, tuple or list of tensors), already on the model's
device.
"""

ForwardStep: TypeAlias = Callable[[Any, Any], Any]
"""``forward_step(model, batch) -> output``.

Runs ``model`` on one micro-batch produced by a :data:`DataStep` and returns the model's output (a ``DataT``:
for language models usually ``{"token_logits": [s, b, v], ...}``), which the loss reduction consumes.
"""
