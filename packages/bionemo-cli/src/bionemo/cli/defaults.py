"""The recipes the CLI always offers: bionemo-esm2's, found even without installed entry-point metadata."""

__all__ = ["register_default_recipes"]


def register_default_recipes() -> None:
    """Register bionemo-esm2's recipes as fallbacks (installed entry points take precedence)."""
    from bionemo.esm2.catalog import RECIPE_TARGETS
    from bionemo.recipes.registry import register_fallback_recipes

    register_fallback_recipes(RECIPE_TARGETS)
