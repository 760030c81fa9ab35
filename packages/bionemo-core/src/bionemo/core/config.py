"""Config contracts: a config knows how to build its model, and a trainable one names its loss reduction."""

from abc import ABC, abstractmethod
from typing import Any, Generic

from bionemo.core.types import LossT, ModelT

__all__ = ["BionemoModelConfig", "BionemoTrainableModelConfig"]


class BionemoModelConfig(Generic[ModelT], ABC):
    """A config that builds a model.

    Subclasses are usually dataclasses (often also a megatron-core ``TransformerConfig``) holding the
    hyper-parameters; ``configure_model`` turns them into a module.
    """

    @abstractmethod
    def configure_model(self, *args: Any, **kwargs: Any) -> ModelT:
        """Build and return the model.

        Args:
            *args: Positional arguments the concrete config accepts (e.g. a tokenizer).
            **kwargs: Keyword arguments the concrete config accepts; ``BionemoLightningModule`` forwards its
                ``**model_construct_args`` here.

        Returns:
            The constructed model. Returning ``None`` is a bug that ``BionemoLightningModule`` reports.
        """
        raise NotImplementedError


class BionemoTrainableModelConfig(BionemoModelConfig[ModelT], Generic[ModelT, LossT]):
    """A model config that can also be trained: it names the loss reduction to train it with."""

    @abstractmethod
    def get_loss_reduction_class(self) -> type[LossT]:
        """Return the loss reduction class (not an instance) used for training and validation.

        The Lightning module builds it with no arguments for training and with ``validation_step=True`` for
        validation and test.
        """
        raise NotImplementedError
