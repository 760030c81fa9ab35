"""The recipe contract (``Recipe``, ``RecipeDefaults``, the ``bionemo.recipes`` entry points) and the choices of a run.

Cheap to import: settings (pydantic), trainers (Lightning, NeMo) and the rest are imported from their modules.
"""

from bionemo.recipes.choices import (
    Accelerator,
    Include,
    Precision,
    SettingsError,
    StrategyChoice,
    WriteIntervalChoice,
)
from bionemo.recipes.registry import (
    ENTRY_POINT_GROUP,
    Recipe,
    RecipeDefaults,
    available_recipes,
    load_recipe,
    register_fallback_recipes,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Accelerator",
    "Include",
    "Precision",
    "Recipe",
    "RecipeDefaults",
    "SettingsError",
    "StrategyChoice",
    "WriteIntervalChoice",
    "available_recipes",
    "load_recipe",
    "register_fallback_recipes",
]
