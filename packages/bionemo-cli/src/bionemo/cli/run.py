"""``bionemo run train`` and ``bionemo run predict``: one set of shared options, recipe-driven."""

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bionemo.recipes.choices import Accelerator, Include, OutputDtype, Precision, StrategyChoice, WriteIntervalChoice

if TYPE_CHECKING:
    from bionemo.recipes.interrupts import TrainingInterrupted

__all__ = ["run_app"]

run_app = typer.Typer(help="Train a model or predict with one.", no_args_is_help=True)

RecipeOpt = Annotated[
    str | None, typer.Option("--recipe", help="Recipe name (see `bionemo recipes list`). Default: esm2-demo.")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML or JSON file of settings; options given here override it.")
]
DataOpt = Annotated[Path | None, typer.Option("--data", help="FASTA (.fasta/.fa/.faa) or CSV (id,sequence) file.")]
OutOpt = Annotated[Path | None, typer.Option("--output-dir", help="Where results go.")]
CkptOpt = Annotated[
    Path | None,
    typer.Option(
        "--checkpoint",
        help="Model weights: a Hugging Face ESM-2 folder or a bionemo .safetensors file (train: start from them).",
    ),
]
DevicesOpt = Annotated[int | None, typer.Option("--devices", min=1, help="Devices per node. Default: 1.")]
NodesOpt = Annotated[
    int | None, typer.Option("--num-nodes", min=1, help="Nodes (torchrun / SLURM launch). Default: 1.")
]
AccelOpt = Annotated[
    Accelerator | None, typer.Option("--accelerator", help="Where to run. Default: auto (GPUs when there are any).")
]
StrategyOpt = Annotated[
    StrategyChoice | None, typer.Option("--strategy", help="auto: megatron on GPUs, Lightning on CPU.")
]
TPOpt = Annotated[
    int | None, typer.Option("--tensor-parallel", min=1, help="Tensor-parallel size (megatron). Default: 1.")
]
PPOpt = Annotated[
    int | None, typer.Option("--pipeline-parallel", min=1, help="Pipeline-parallel size (megatron). Default: 1.")
]
CPOpt = Annotated[
    int | None, typer.Option("--context-parallel", min=1, help="Context-parallel size (megatron). Default: 1.")
]
PrecisionOpt = Annotated[
    Precision | None, typer.Option("--precision", help="Numeric precision. Default: the recipe's.")
]
MBSOpt = Annotated[
    int | None, typer.Option("--micro-batch-size", min=1, help="Sequences per batch per device. Default: the recipe's.")
]
GBSOpt = Annotated[
    int | None,
    typer.Option(
        "--global-batch-size", min=1, help="Sequences per optimizer step, all devices. Default: the recipe's."
    ),
]
TruncateOpt = Annotated[
    bool, typer.Option("--truncate", help="Cut sequences longer than the model allows (default: refuse them).")
]
VerboseOpt = Annotated[
    bool, typer.Option("--verbose", help="Also show the libraries' warnings and notes (hidden by default).")
]

IncludeOpt = Annotated[
    list[Include] | None,
    typer.Option(
        "--include",
        help="Repeat to choose outputs (residue-embeddings: per residue; cls: the <cls> vector). Default: embeddings, perplexity.",
    ),
]
WriteIntervalOpt = Annotated[
    WriteIntervalChoice | None,
    typer.Option(
        "--write-interval",
        help="batch: shards stream to disk as they come and a rerun resumes; epoch: one per device at the end. Default: batch.",
    ),
]
TokensPerBatchOpt = Annotated[
    int | None,
    typer.Option(
        "--tokens-per-batch",
        min=1,
        help="Batch length-sorted sequences up to this many tokens (padding included) instead of by count.",
    ),
]
LayerOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--layer", help="Repeat to add layers' embeddings (0 = embedding output, num_layers = last, -1 = last)."
    ),
]
OutputDtypeOpt = Annotated[
    OutputDtype | None,
    typer.Option("--output-dtype", help="Type of written embeddings and logits. Default: float32."),
]
UnpaddedOpt = Annotated[
    bool | None,
    typer.Option(
        "--unpadded/--padded",
        help="Batches without padding (variable-length flash attention: GPUs in bf16/fp16, no model "
        "parallelism) or padded. Same outputs. Default: unpadded wherever it can run.",
        show_default=False,
    ),
]


def _run(
    command: str, file: Path | None, overrides: dict[str, Any], verbose: bool = False, ctx: typer.Context | None = None
) -> None:
    from bionemo.cli._quiet import quiet_libraries
    from bionemo.core.megatron_env import prepare_megatron_import

    quiet_libraries(verbose)  # before torch, megatron and friends are imported: some warn while importing

    prepare_megatron_import()  # before anything imports megatron-core

    from bionemo.cli.defaults import register_default_recipes
    from bionemo.cli.summary import print_summary
    from bionemo.recipes.registry import load_recipe
    from bionemo.recipes.settings import RunSettings, SettingsError

    register_default_recipes()
    try:
        settings = RunSettings.resolve(file, overrides)
        try:
            recipe = load_recipe(settings.recipe)
        except KeyError as error:
            raise SettingsError(str(error.args[0]), "--recipe") from None
        rows = getattr(recipe, command)(settings)
    except SettingsError as error:
        raise typer.BadParameter(str(error), param_hint=f"'{error.option}'") from None
    except _training_interrupted() as stop:  # evaluated only when something other than a SettingsError is raised
        if stop.report:
            # the rerun drops --no-resume; a config file's "resume: false" the user has to change
            config_says_no = not RunSettings.resolve(file, {**overrides, "resume": None}).resume
            typer.echo(_interrupted(stop, _rerun_command(ctx), config=file if config_says_no else None), err=True)
        raise typer.Exit(128 + int(stop.signal)) from None
    if rows:
        print_summary(f"bionemo run {command}", rows)


def _training_interrupted() -> "type[TrainingInterrupted]":
    """The exception a signal stops training with; imported late: its module imports torch and Lightning."""
    from bionemo.recipes.interrupts import TrainingInterrupted

    return TrainingInterrupted


def _rerun_command(ctx: typer.Context | None) -> str:
    """The command line that ran ``ctx``'s command, rebuilt from its options, without ``--no-resume``."""
    if ctx is None:
        return "the same command"
    words = ["bionemo", "run", ctx.info_name or ctx.command.name or ""]
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if param.name == "no_resume" or value is None or value == param.default:
            continue
        option = max(param.opts, key=len)
        if getattr(param, "is_flag", False):
            words.append(option)
            continue
        for item in value if param.multiple else [value]:
            words += [option, str(getattr(item, "value", item))]
    return shlex.join(words)


def _interrupted(stop: "TrainingInterrupted", command: str, *, config: Path | None) -> str:
    """The one line printed when training stopped on a signal."""
    stopped = f"Training stopped by {stop.signal.name} after step {stop.step}"
    if stop.checkpoint is None:
        reason = f" ({stop.save_error})" if stop.save_error else ""
        return f"{stopped}; no checkpoint was saved{reason}. Rerun to resume from the last periodic one: {command}"
    enable = f" (after setting resume: true in {config})" if config is not None else ""
    return f"{stopped}; checkpoint saved to {stop.checkpoint}. Resume with: {command}{enable}"


@run_app.command()
def train(
    ctx: typer.Context,
    recipe: RecipeOpt = None,
    config: ConfigOpt = None,
    data: DataOpt = None,
    output_dir: OutOpt = None,
    checkpoint: CkptOpt = None,
    devices: DevicesOpt = None,
    num_nodes: NodesOpt = None,
    accelerator: AccelOpt = None,
    strategy: StrategyOpt = None,
    tensor_parallel: TPOpt = None,
    pipeline_parallel: PPOpt = None,
    context_parallel: CPOpt = None,
    precision: PrecisionOpt = None,
    micro_batch_size: MBSOpt = None,
    global_batch_size: GBSOpt = None,
    truncate: TruncateOpt = False,
    verbose: VerboseOpt = False,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", min=1, help="Optimizer steps. Default: the recipe's.")
    ] = None,
    val_check_interval: Annotated[
        int | None, typer.Option("--val-check-interval", min=1, help="Steps between validations.")
    ] = None,
    lr: Annotated[float | None, typer.Option("--lr", min=0.0, help="Learning rate. Default: the recipe's.")] = None,
    no_resume: Annotated[
        bool,
        typer.Option("--no-resume", help="Start afresh (default: continue from the checkpoint in --output-dir)."),
    ] = False,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Random seed (data split, masking, init). Default: 0.")
    ] = None,
) -> None:
    """Train (or fine-tune) the recipe's model; with no options, trains the demo on synthetic protein families."""
    overrides = {k: v for k, v in locals().items() if k not in ("ctx", "config", "no_resume", "verbose")}
    overrides.update(truncate=truncate or None, resume=False if no_resume else None)  # unset flags: config decides
    _run("train", config, overrides, verbose, ctx)


@run_app.command()
def predict(
    recipe: RecipeOpt = None,
    config: ConfigOpt = None,
    data: DataOpt = None,
    output_dir: OutOpt = None,
    checkpoint: CkptOpt = None,
    devices: DevicesOpt = None,
    num_nodes: NodesOpt = None,
    accelerator: AccelOpt = None,
    strategy: StrategyOpt = None,
    tensor_parallel: TPOpt = None,
    pipeline_parallel: PPOpt = None,
    context_parallel: CPOpt = None,
    precision: PrecisionOpt = None,
    micro_batch_size: MBSOpt = None,
    global_batch_size: GBSOpt = None,
    truncate: TruncateOpt = False,
    verbose: VerboseOpt = False,
    include: IncludeOpt = None,
    write_interval: WriteIntervalOpt = None,
    tokens_per_batch: TokensPerBatchOpt = None,
    layer: LayerOpt = None,
    output_dtype: OutputDtypeOpt = None,
    unpadded: UnpaddedOpt = None,
) -> None:
    """Predict per-sequence outputs; with no options, the bundled demo sequences with the bundled weights."""
    overrides = {k: v for k, v in locals().items() if k not in ("config", "verbose")}
    overrides.update(truncate=truncate or None)  # unset flags (None): the config decides
    _run("predict", config, overrides, verbose)
