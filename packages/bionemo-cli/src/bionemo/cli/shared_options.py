"""The options ``bionemo run``'s commands share, each written once, and :func:`with_options`, which gives them.

A command takes ``**options`` and lists its options, in the order ``--help`` shows them, in ``@with_options``::

    @run_app.command()
    @with_options(*RUN_OPTIONS, option(bool, "--overwrite", default=False, help="Replace earlier outputs."))
    def predict(**options: Any) -> None: ...

Typer reads each listed option as a keyword-only parameter of the command, ``name: Annotated[type,
typer.Option(...)] = default``, as if it were written out in the signature; ``options`` receives them all.

Imports only the standard library, typer and bionemo modules that ``bionemo --help`` loads anyway (no torch).
"""

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from bionemo.esm2.data.readers import DATA_FORMATS
from bionemo.recipes.choices import Accelerator, Precision, StrategyChoice

__all__ = [
    "CHECKPOINT",
    "CONFIG",
    "LAYOUT_OPTIONS",
    "OUTPUT_DIR",
    "RECIPE",
    "RUN_OPTIONS",
    "TRUNCATE",
    "VERBOSE",
    "option",
    "training_options",
    "with_options",
]

Command = Callable[..., None]


def option(annotation: Any, *declarations: str, default: Any = None, **settings: Any) -> inspect.Parameter:
    """The keyword-only command parameter ``name: Annotated[annotation, typer.Option(*declarations, **settings)]``.

    Its name is the first declaration's, without the dashes and with ``_`` for ``-``: ``--output-dir`` gives
    ``output_dir``, ``--unpadded/--padded`` gives ``unpadded``.
    """
    name = declarations[0].split("/")[0].lstrip("-").replace("-", "_")
    annotated = Annotated[annotation, typer.Option(*declarations, **settings)]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotated)


def with_options(*options: inspect.Parameter) -> Callable[[Command], Command]:
    """Give the decorated command ``options``, after its own parameters (such as ``ctx: typer.Context``).

    The command declares ``**options: Any`` last; it is called with its own parameters and every option by keyword,
    the options in the order listed (the order ``locals()`` would hold them in, had they been written out).

    Raises:
        TypeError: The command has no ``**`` parameter to receive the options.
        ValueError: An option has the name of another option or of one of the command's own parameters.
    """

    def decorate(command: Command) -> Command:
        own = list(inspect.signature(command).parameters.values())
        if not own or own[-1].kind is not inspect.Parameter.VAR_KEYWORD:
            raise TypeError(f"{command.__qualname__} needs a last parameter **options to receive its options")
        signature = inspect.Signature([*own[:-1], *options], return_annotation=None)
        names = list(signature.parameters)

        @functools.wraps(command)
        def with_its_options(**given: Any) -> None:
            command(**{name: given[name] for name in names})

        vars(with_its_options)["__signature__"] = signature  # what inspect.signature (Typer) answers
        with_its_options.__annotations__ = {  # what typing.get_type_hints answers
            **{k: v for k, v in command.__annotations__.items() if k != own[-1].name},
            **{o.name: o.annotation for o in options},
        }
        return with_its_options

    return decorate


RECIPE = option(str | None, "--recipe", help="Recipe name (see `bionemo recipes list`). Default: esm2-demo.")
CONFIG = option(Path | None, "--config", help="YAML or JSON file of settings; options given here override it.")
OUTPUT_DIR = option(Path | None, "--output-dir", help="Where results go.")
CHECKPOINT = option(
    Path | None,
    "--checkpoint",
    help="Model weights: a Hugging Face ESM-2 folder or a bionemo .safetensors file (train: start from them).",
)
TRUNCATE = option(
    bool, "--truncate", default=False, help="Cut sequences longer than the model allows (default: refuse them)."
)
VERBOSE = option(
    bool, "--verbose", default=False, help="Also show the libraries' warnings and notes (hidden by default)."
)

LAYOUT_OPTIONS = (
    option(int | None, "--devices", min=1, help="Devices per node. Default: 1."),
    option(int | None, "--num-nodes", min=1, help="Nodes (torchrun / SLURM launch). Default: 1."),
    option(Accelerator | None, "--accelerator", help="Where to run. Default: auto (GPUs when there are any)."),
    option(StrategyChoice | None, "--strategy", help="auto: megatron on GPUs, Lightning on CPU."),
    option(int | None, "--tensor-parallel", min=1, help="Tensor-parallel size (megatron). Default: 1."),
    option(int | None, "--pipeline-parallel", min=1, help="Pipeline-parallel size (megatron). Default: 1."),
    option(int | None, "--context-parallel", min=1, help="Context-parallel size (megatron). Default: 1."),
    option(Precision | None, "--precision", help="Numeric precision. Default: the recipe's."),
    option(
        int | None,
        "--micro-batch-size",
        min=1,
        help="Sequences per batch per device (run train by tokens: micro-batches of up to this many full-length "
        "sequences' tokens). Default: the recipe's.",
    ),
    option(
        int | None,
        "--global-batch-size",
        min=1,
        help="Sequences per optimizer step, all devices (training: batches by count). Default: the recipe's.",
    ),
)
"""Where a run goes (devices, nodes, accelerator), how the model is split over them, its precision and batch sizes."""

RUN_OPTIONS = (
    RECIPE,
    CONFIG,
    option(Path | None, "--data", help=f"Sequences: {DATA_FORMATS}."),
    OUTPUT_DIR,
    CHECKPOINT,
    *LAYOUT_OPTIONS,
    TRUNCATE,
    VERBOSE,
)
"""The options of ``run train`` and ``run predict``, first among each one's (``run finetune`` orders its own)."""


def training_options(*, max_steps: str, val_check_interval: str, lr: str, seed: str) -> tuple[inspect.Parameter, ...]:
    """``--max-steps``, ``--val-check-interval``, ``--lr``, ``--no-resume`` and ``--seed``, in that order.

    The help texts of all but ``--no-resume`` name the command's defaults, which differ between ``run train`` and
    ``run finetune``: they are given here.
    """
    return (
        option(int | None, "--max-steps", min=1, help=max_steps),
        option(int | None, "--val-check-interval", min=1, help=val_check_interval),
        option(float | None, "--lr", min=0.0, help=lr),
        option(
            bool,
            "--no-resume",
            default=False,
            help="Start afresh, removing the checkpoints in --output-dir (default: continue this run from them).",
        ),
        option(int | None, "--seed", help=seed),
    )
