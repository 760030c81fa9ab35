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
def show_recipe(
    name: Annotated[str, typer.Argument(help="Recipe name.")],
    cpu: Annotated[
        bool, typer.Option("--cpu", help="The settings of training on CPUs (some recipes have their own for them).")
    ] = False,
) -> None:
    """Print a recipe's full default settings as JSON; save it, edit it and pass it as --config."""
    from bionemo.cli.defaults import register_default_recipes
    from bionemo.recipes.registry import load_recipe
    from bionemo.recipes.settings import RunSettings

    register_default_recipes()

    try:
        recipe = load_recipe(name)
    except KeyError as error:
        raise typer.BadParameter(str(error.args[0]), param_hint="'NAME'") from None
    defaults = recipe.defaults.for_training(gpu=not cpu)
    settings = RunSettings.model_validate({"recipe": name, **defaults.as_settings()}).model_dump(mode="json")
    typer.echo(json.dumps(settings, indent=2))
    if not cpu and recipe.defaults.cpu is not None:  # on stderr: stdout stays a valid --config
        values = ", ".join(f"{key} {value}" for key, value in recipe.defaults.cpu.as_settings().items())
        typer.echo(
            f"Training on CPUs uses {values} wherever neither an option nor --config sets them "
            f"(`bionemo recipes show {name} --cpu`).",
            err=True,
        )
