"""``bionemo recipes list`` and ``bionemo recipes show NAME``."""

import json
from typing import Annotated

import typer

__all__ = ["recipes_app"]

recipes_app = typer.Typer(help="The recipes you can run.", no_args_is_help=True)


@recipes_app.command("list")
def list_recipes() -> None:
    """List installed recipes (from the `bionemo.recipes` entry-point group)."""
    from rich.console import Console
    from rich.table import Table

    from bionemo.cli.defaults import register_default_recipes
    from bionemo.recipes.registry import available_recipes, load_recipe

    register_default_recipes()

    table = Table("recipe", "description", "provided by")
    for name, target in sorted(available_recipes().items()):
        table.add_row(name, load_recipe(name).description, target.split(":")[0])
    Console().print(table)


@recipes_app.command("show")
def show_recipe(name: Annotated[str, typer.Argument(help="Recipe name.")]) -> None:
    """Print a recipe's full default settings as JSON; save it, edit it and pass it as --config."""
    from bionemo.cli.defaults import register_default_recipes
    from bionemo.recipes.registry import load_recipe
    from bionemo.recipes.settings import RunSettings

    register_default_recipes()

    try:
        recipe = load_recipe(name)
    except KeyError as error:
        raise typer.BadParameter(str(error.args[0]), param_hint="'NAME'") from None
    settings = RunSettings.model_validate({"recipe": name, **recipe.defaults.as_settings()}).model_dump(mode="json")
    typer.echo(json.dumps(settings, indent=2))
