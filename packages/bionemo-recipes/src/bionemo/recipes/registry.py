"""The recipe contract and registry: named model + data + defaults, found through the ``bionemo.recipes`` entry points.

Another installed package adds recipes by declaring, in its ``pyproject.toml``::

    [project.entry-points."bionemo.recipes"]
    my-model = "my_package.recipes:my_model"

where ``my_model`` is a :class:`Recipe` (or a function returning one).
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

__all__ = ["ENTRY_POINT_GROUP", "Recipe", "available_recipes", "load_recipe", "register_fallback_recipes"]

ENTRY_POINT_GROUP = "bionemo.recipes"

_FALLBACK: dict[str, str] = {}
"""Recipes registered with :func:`register_fallback_recipes`: found when sources run without installed metadata
(e.g. from PYTHONPATH), where entry points are missing."""


def register_fallback_recipes(targets: Mapping[str, str]) -> None:
    """Make ``name -> "module:attribute"`` recipes findable without installed entry-point metadata.

    Installed entry points with the same name take precedence.
    """
    _FALLBACK.update(targets)


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """What the CLI needs to train and predict one model family.

    Attributes:
        name: The name users pass to ``--recipe``.
        description: One line for ``bionemo recipes list``.
        defaults: Default values of the run settings (see ``RunSettings``) and of the model hyper-parameters
            (under ``model``).
        train: ``train(settings) -> summary rows``: runs training.
        predict: ``predict(settings) -> summary rows``: runs prediction.
    """

    name: str
    description: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    train: Callable[..., Any]
    predict: Callable[..., Any]


def available_recipes() -> dict[str, str]:
    """Recipe names and their ``module:attribute`` targets (nothing is imported)."""
    return {**_FALLBACK, **{ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}}


def load_recipe(name: str) -> Recipe:
    """Import and return the recipe called ``name``.

    Raises:
        KeyError: No installed recipe has that name (the message lists the valid ones).
    """
    target = available_recipes().get(name)
    if target is None:
        raise KeyError(f"unknown recipe {name!r}; installed recipes: {sorted(available_recipes())}")
    loaded = EntryPoint(name=name, value=target, group=ENTRY_POINT_GROUP).load()
    recipe = loaded() if callable(loaded) and not isinstance(loaded, Recipe) else loaded
    if not isinstance(recipe, Recipe):
        raise TypeError(f"entry point {target!r} of recipe {name!r} gave {type(recipe).__name__}, not a Recipe")
    return recipe
