"""The recipe contract and registry: named model + data + defaults, found through the ``bionemo.recipes`` entry points.

Another installed package adds recipes by declaring, in its ``pyproject.toml``::

    [project.entry-points."bionemo.recipes"]
    my-model = "my_package.recipes:my_model"

where ``my_model`` is a :class:`Recipe` (or a function of no arguments returning one).
"""

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol, overload, runtime_checkable

from bionemo.recipes.choices import Precision

if TYPE_CHECKING:  # pydantic: not imported by the registry itself
    from bionemo.recipes.settings import RunSettings

__all__ = [
    "ENTRY_POINT_GROUP",
    "CPUDefaults",
    "Recipe",
    "RecipeDefaults",
    "SummaryRows",
    "available_recipes",
    "load_recipe",
    "register_fallback_recipes",
]

ENTRY_POINT_GROUP = "bionemo.recipes"

SummaryRows = list[tuple[str, str | Path]]
"""What a recipe's command reports at the end: (name, text) rows, and (name, path) rows for the files it wrote
(printed whole, below the table)."""

_FALLBACK: dict[str, str] = {}
"""Recipes registered with :func:`register_fallback_recipes`: found when sources run without installed metadata
(e.g. from PYTHONPATH), where entry points are missing."""


def register_fallback_recipes(targets: Mapping[str, str]) -> None:
    """Make ``name -> "module:attribute"`` recipes findable without installed entry-point metadata.

    Installed entry points with the same name take precedence.
    """
    _FALLBACK.update(targets)


_POSITIVE = ("micro_batch_size", "global_batch_size", "max_steps", "val_check_interval", "lr")


@dataclass(frozen=True, kw_only=True, slots=True)
class CPUDefaults:
    """What a recipe trains with on CPUs in place of its own defaults (``None``: the recipe's own).

    For recipes whose defaults are sized for GPUs but that also train on a CPU: 500,000 steps of 256 sequences would
    never finish there. Each applies only to a training run on CPUs in which neither an option nor ``--config``
    sets that setting.
    """

    max_steps: int | None = None
    """Optimizer steps of a training run on CPUs."""
    global_batch_size: int | None = None
    """Sequences per optimizer step on CPUs, all processes."""
    micro_batch_size: int | None = None
    """Sequences per batch per process on CPUs."""
    val_check_interval: int | None = None
    """Training steps between validations (and periodic checkpoints) on CPUs."""

    def __post_init__(self) -> None:
        for item in fields(self):
            given = getattr(self, item.name)
            if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given <= 0):
                raise ValueError(f"CPUDefaults.{item.name} must be a positive integer or None, got {given!r}")

    def as_settings(self) -> dict[str, int]:
        """The settings these defaults change, by ``RunSettings`` name."""
        return {item.name: getattr(self, item.name) for item in fields(self) if getattr(self, item.name) is not None}


@dataclass(frozen=True, kw_only=True, slots=True)
class RecipeDefaults:
    """A recipe's default run settings (each one a ``RunSettings`` field) and its model settings.

    A setting given on the command line or in ``--config`` wins over these (:meth:`value`).
    """

    micro_batch_size: int
    """Sequences per batch per device."""
    global_batch_size: int
    """Sequences per optimizer step, all devices."""
    max_steps: int
    """Optimizer steps of a training run."""
    val_check_interval: int
    """Training steps between validations (and periodic checkpoints)."""
    lr: float
    """Learning rate."""
    precision: Precision
    """Numeric precision the recipe is meant for: training on GPUs runs at it unless ``--precision`` says otherwise
    (training on CPUs at 32 bits; prediction on GPUs at bf16)."""
    model: Mapping[str, Any] = field(default_factory=dict)
    """Model hyper-parameters, by name; what they may be is the model's business (e.g. ``ESM2ModelSettings``).
    Stored read-only."""
    cpu: CPUDefaults | None = None
    """Run length and batch sizes of training on CPUs, where they differ from the above (:meth:`for_training`)."""
    tokens_on_gpus: bool = False
    """Training on GPUs cuts batches by tokens unless a global batch size is given: up to :attr:`global_batch_size`
    sequences of the model's ``seq_length`` per step (:meth:`global_batch_tokens`). On CPUs batches are by count."""

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            given = getattr(self, name)
            if isinstance(given, bool) or not isinstance(given, int | float) or given <= 0:
                raise ValueError(f"RecipeDefaults.{name} must be a positive number, got {given!r}")
        if not isinstance(self.precision, Precision):
            try:
                object.__setattr__(self, "precision", Precision(self.precision))
            except ValueError:
                valid = ", ".join(p.value for p in Precision)
                raise ValueError(f"RecipeDefaults.precision {self.precision!r} is not one of: {valid}") from None
        object.__setattr__(self, "model", MappingProxyType(dict(self.model)))
        if self.cpu is not None and not isinstance(self.cpu, CPUDefaults):
            raise TypeError(f"RecipeDefaults.cpu must be a CPUDefaults or None, got {type(self.cpu).__name__}")

    def for_training(self, *, gpu: bool) -> "RecipeDefaults":
        """The defaults a training run uses: on CPUs (``gpu=False``) by count, with :attr:`cpu`'s values in place."""
        if gpu:
            return self
        return replace(self, **(self.cpu.as_settings() if self.cpu else {}), cpu=None, tokens_on_gpus=False)

    def global_batch_tokens(self) -> int | None:
        """Tokens per step of a training run on GPUs given no batch size (:attr:`tokens_on_gpus`), else None.

        Raises:
            ValueError: :attr:`tokens_on_gpus` is set but the model has no integer ``seq_length`` (checked here,
                not at construction, so that a recipe's own check of its model settings speaks first).
        """
        if not self.tokens_on_gpus:
            return None
        seq_length = self.model.get("seq_length")
        if isinstance(seq_length, bool) or not isinstance(seq_length, int):
            raise ValueError(f"RecipeDefaults.tokens_on_gpus needs the model's seq_length (an int), got {seq_length!r}")
        return self.global_batch_size * seq_length

    @overload
    def value(self, settings: "RunSettings", name: Literal["lr"]) -> float: ...
    @overload
    def value(self, settings: "RunSettings", name: Literal["precision"]) -> Precision: ...
    @overload
    def value(
        self,
        settings: "RunSettings",
        name: Literal["micro_batch_size", "global_batch_size", "max_steps", "val_check_interval"],
    ) -> int: ...
    def value(self, settings: "RunSettings", name: str) -> Any:
        """The run setting ``name``: given on the command line / in ``--config``, else this default."""
        given = getattr(settings, name)
        return getattr(self, name) if given is None else given

    def as_settings(self) -> dict[str, Any]:
        """These defaults as ``RunSettings`` input (a ``--config`` file's content): plain values, ``model`` a dict.

        With :attr:`tokens_on_gpus` the batches are ``global_batch_tokens`` (the global batch size left unset).
        """
        tokens = self.global_batch_tokens()
        return {
            "micro_batch_size": self.micro_batch_size,
            "global_batch_size": None if tokens else self.global_batch_size,
            **({"global_batch_tokens": tokens} if tokens else {}),
            "max_steps": self.max_steps,
            "val_check_interval": self.val_check_interval,
            "lr": self.lr,
            "precision": self.precision.value,
            "model": dict(self.model),
        }


@runtime_checkable
class Recipe(Protocol):
    """What the CLI needs to train and predict one model family.

    ``isinstance(obj, Recipe)`` checks that the members exist, not their types.
    """

    @property
    def name(self) -> str:
        """The name users pass to ``--recipe``."""
        ...

    @property
    def description(self) -> str:
        """One line for ``bionemo recipes list``."""
        ...

    @property
    def defaults(self) -> RecipeDefaults:
        """Default values of the run settings and the model hyper-parameters."""
        ...

    def train(self, settings: "RunSettings") -> SummaryRows:
        """Run training; the summary rows (empty on ranks other than the first)."""
        ...

    def predict(self, settings: "RunSettings") -> SummaryRows:
        """Run prediction; the summary rows (empty on ranks other than the first)."""
        ...


def available_recipes() -> dict[str, str]:
    """Recipe names and their ``module:attribute`` targets (nothing is imported)."""
    return {**_FALLBACK, **{ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}}


def load_recipe(name: str) -> Recipe:
    """Import and return the recipe called ``name``.

    Raises:
        KeyError: No installed recipe has that name (the message lists the valid ones).
        TypeError: The entry point is neither a :class:`Recipe` nor a function of no arguments returning one.
    """
    target = available_recipes().get(name)
    if target is None:
        raise KeyError(f"unknown recipe {name!r}; installed recipes: {sorted(available_recipes())}")
    loaded = EntryPoint(name=name, value=target, group=ENTRY_POINT_GROUP).load()
    if isinstance(loaded, Recipe) and not isinstance(loaded, type):  # a class has its fields as attributes
        return loaded
    if not callable(loaded):
        raise TypeError(
            f"entry point {target!r} of recipe {name!r} is {type(loaded).__name__}, "
            "not a Recipe or a function of no arguments returning one"
        )
    try:
        inspect.signature(loaded).bind()
    except TypeError:
        raise TypeError(
            f"entry point {target!r} of recipe {name!r} needs arguments; "
            "it must be a Recipe or a function of no arguments returning one"
        ) from None
    except ValueError:  # no signature to inspect (some builtins): calling it tells
        pass
    recipe = loaded()
    if not isinstance(recipe, Recipe) or isinstance(recipe, type):
        raise TypeError(f"entry point {target!r} of recipe {name!r} gave {type(recipe).__name__}, not a Recipe")
    return recipe
