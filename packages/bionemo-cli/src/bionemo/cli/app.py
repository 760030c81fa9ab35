"""The root Typer app of the ``bionemo`` command.

Only typer and the standard library are imported at module level so that ``bionemo --help`` answers at
once; torch, lightning, nemo and megatron are imported inside the commands that need them.
"""

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

__all__ = ["app", "main", "skip_unused_imports"]

app = typer.Typer(
    name="bionemo",
    help="Train and serve biological language models on Megatron-core with Lightning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_DISTRIBUTIONS = (
    "bionemo-core",
    "bionemo-collate",
    "bionemo-losses",
    "bionemo-callbacks",
    "bionemo-lightning",
    "bionemo-recipes",
    "bionemo-esm2",
    "bionemo-cli",
)


def _installed_versions() -> dict[str, str]:
    found = {}
    for name in _DISTRIBUTIONS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def _print_versions(value: bool) -> None:
    if value:
        for name, ver in _installed_versions().items():
            typer.echo(f"{name} {ver}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_versions,
            help="Print the installed versions and exit.",
        ),
    ] = False,
) -> None:
    """Train and serve biological language models on Megatron-core with Lightning."""


@app.command("packages")
def packages() -> None:
    """List the bionemo sub-packages and their installed versions."""
    for name, ver in _installed_versions().items():
        typer.echo(f"{name:20} {ver}")


from bionemo.cli.convert import convert_app  # noqa: E402
from bionemo.cli.recipes_cmd import recipes_app  # noqa: E402
from bionemo.cli.run import run_app  # noqa: E402

app.add_typer(run_app, name="run")
app.add_typer(recipes_app, name="recipes")
app.add_typer(convert_app, name="convert")


def skip_unused_imports() -> None:
    """Arm the import skips of the ``bionemo`` command, for this process only; imports neither package.

    torchmetrics then imports no transformers, scipy.signal, matplotlib or regex
    (:mod:`bionemo.core.skip_torchmetrics_imports`), megatron's timers no wandb or TensorBoard
    (:mod:`bionemo.core.skip_megatron_timer_writers`): no command uses them. megatron's ``torch.compile``
    decorations import torch's compiler when first called, not when megatron is imported
    (:mod:`bionemo.core.defer_megatron_compile`), megatron imports torch's DTensor and FSDP packages only when
    a run uses them (:mod:`bionemo.core.defer_megatron_dtensor`), and Lightning recognises compiled modules without
    importing TorchDynamo (:mod:`bionemo.core.defer_lightning_dynamo`).
    """
    from bionemo.core.defer_lightning_dynamo import defer_lightning_dynamo
    from bionemo.core.defer_megatron_compile import defer_megatron_compile
    from bionemo.core.defer_megatron_dtensor import defer_megatron_dtensor
    from bionemo.core.skip_megatron_timer_writers import skip_megatron_timer_writers
    from bionemo.core.skip_torchmetrics_imports import skip_torchmetrics_imports

    skip_torchmetrics_imports()
    skip_megatron_timer_writers()
    defer_megatron_compile()
    defer_megatron_dtensor()
    defer_lightning_dynamo()


def main() -> None:
    """Entry point of the ``bionemo`` console script (exits without the interpreter's teardown, see ``_fast_exit``).

    Before any command runs it calls :func:`skip_unused_imports`.
    """
    from bionemo.cli._fast_exit import run_then_exit_fast

    skip_unused_imports()
    run_then_exit_fast(app)
