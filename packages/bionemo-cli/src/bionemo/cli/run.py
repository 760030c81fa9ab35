"""``bionemo run train`` and ``bionemo run predict``: one set of shared options, recipe-driven."""

import os
import shlex
import shutil
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bionemo.esm2.data.readers import DATA_FORMATS
from bionemo.esm2.finetune.head_config import HeadChoice  # the standard library only: --help stays fast
from bionemo.esm2.finetune.spec import LORA_TARGETS, EncoderMode
from bionemo.esm2.finetune.tasks import Task
from bionemo.recipes.choices import Accelerator, Include, OutputDtype, Precision, StrategyChoice, WriteIntervalChoice

if TYPE_CHECKING:
    from bionemo.recipes.interrupts import TrainingAborted, TrainingInterrupted

__all__ = ["run_app"]

run_app = typer.Typer(help="Train a model or predict with one.", no_args_is_help=True)

RecipeOpt = Annotated[
    str | None, typer.Option("--recipe", help="Recipe name (see `bionemo recipes list`). Default: esm2-demo.")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML or JSON file of settings; options given here override it.")
]
DataOpt = Annotated[Path | None, typer.Option("--data", help=f"Sequences: {DATA_FORMATS}.")]
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
NoResumeOpt = Annotated[
    bool, typer.Option("--no-resume", help="Start afresh (default: continue from the checkpoint in --output-dir).")
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
        help="Batch length-sorted sequences up to this many tokens (padding included). Default: sized from the "
        "model and the device (up to 131,072 on GPUs, 8,192 on CPUs), or by count with --micro-batch-size.",
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


def _training_overrides(options: dict[str, Any]) -> dict[str, Any]:
    """The settings a training command's options give (``run train``, ``run finetune``).

    Unset flags are None, so that ``--config`` decides them.
    """
    overrides = {k: v for k, v in options.items() if k not in ("ctx", "config", "no_resume", "verbose")}
    overrides.update(truncate=options["truncate"] or None, resume=False if options["no_resume"] else None)
    return overrides


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
        run = getattr(recipe, command, None)
        if run is None:
            raise SettingsError(f"recipe {settings.recipe} cannot {command}; the ESM-2 recipes can", "--recipe")
        rows = run(settings)
    except SettingsError as error:
        raise typer.BadParameter(str(error), param_hint=f"'{error.option}'") from None
    except _training_interrupted() as stop:  # evaluated only when something other than a SettingsError is raised
        if stop.report:
            typer.echo(_interrupted(stop, file, overrides, ctx), err=True)
        raise typer.Exit(stop.status) from None
    except (KeyboardInterrupt, SystemExit) as error:
        if not _is_ctrl_c(error):
            raise
        aborted = _training_aborted(error)
        if aborted is None:
            from bionemo.recipes.trainers import is_launching_rank

            if is_launching_rank():
                typer.echo(f"bionemo run {command} stopped by SIGINT.", err=True)
        elif aborted.report:
            rerun = _rerun_advice(aborted.checkpoint_dir, file, overrides, ctx)
            typer.echo(f"Training stopped at once by a second SIGINT; no checkpoint was saved{rerun}", err=True)
        raise typer.Exit(128 + int(signal.SIGINT)) from None
    if rows:
        print_summary(f"bionemo run {command}", rows)


def _training_interrupted() -> "type[TrainingInterrupted]":
    """The exception a signal stops training with; imported late: its module imports torch and Lightning."""
    from bionemo.recipes.interrupts import TrainingInterrupted

    return TrainingInterrupted


def _is_ctrl_c(error: BaseException) -> bool:
    """True for a ``KeyboardInterrupt``, and for the ``exit(1)`` Lightning turns one into once it has shut down."""
    return isinstance(error, KeyboardInterrupt) or isinstance(error.__context__, KeyboardInterrupt)


def _training_aborted(error: BaseException) -> "TrainingAborted | None":
    """The second Ctrl-C that stopped training at once, behind ``error``; None if training was not stopped so."""
    if "bionemo.recipes.interrupts" not in sys.modules:
        return None  # training never began (and importing torch now would only delay the exit)
    from bionemo.recipes.interrupts import aborted_by

    return aborted_by(error)


def _interrupted(
    stop: "TrainingInterrupted", file: Path | None, overrides: dict[str, Any], ctx: typer.Context | None
) -> str:
    """The one line printed when training stopped on a signal: what was saved and the command that resumes."""
    stopped = f"Training stopped by {stop.signal.name} after step {stop.step}"
    if stop.checkpoint is None:
        reason = f" ({stop.save_error})" if stop.save_error else ""
        return f"{stopped}; no checkpoint was saved{reason}{_rerun_advice(stop.checkpoint_dir, file, overrides, ctx)}"
    resume = f"Resume with: {_rerun_command(ctx)}{_enable_resume(file, overrides)}"
    return f"{stopped}; checkpoint saved to {stop.checkpoint}. {resume}"


def _rerun_advice(checkpoint_dir: Path, file: Path | None, overrides: dict[str, Any], ctx: typer.Context | None) -> str:
    """The end of the line printed after a stop that saved nothing: the checkpoint a rerun resumes from, the command."""
    from bionemo.recipes.checkpoints import resume_checkpoint
    from bionemo.recipes.settings import RunSettings

    resume_from = resume_checkpoint(RunSettings.resolve(file, overrides), checkpoint_dir)
    if resume_from is None:
        return f", and there is none to resume from. Rerun to start afresh: {_rerun_command(ctx)}"
    return f". Rerun to resume from {resume_from}: {_rerun_command(ctx)}{_enable_resume(file, overrides)}"


def _enable_resume(file: Path | None, overrides: dict[str, Any]) -> str:
    """What to change first when the ``--config`` file says ``resume: false`` (the rerun drops ``--no-resume``)."""
    from bionemo.recipes.settings import RunSettings

    if file is None or RunSettings.resolve(file, {**overrides, "resume": None}).resume:
        return ""
    return f" (after setting resume: true in {file})"


def _rerun_command(ctx: typer.Context | None) -> str:
    """The command line that ran ``ctx``'s command, started the way this process was, without ``--no-resume``."""
    if ctx is None:
        return "the same command"
    words = [*_launch_words(os.environ, sys.argv[0], _main_module()), "run", ctx.info_name or ctx.command.name or ""]
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


def _main_module() -> str | None:
    """``bionemo.cli`` when this process is ``python -m bionemo.cli``, else None."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return "bionemo.cli" if getattr(spec, "name", None) == "bionemo.cli.__main__" else None


def _launch_words(environ: Mapping[str, str], argv0: str, main_module: str | None) -> list[str]:
    """The words before ``run``: how this process was started, as the user can type them again.

    Args:
        environ: The process's environment. ``uv run`` sets ``UV_RUN_RECURSION_DEPTH`` (and ``UV``, its own path)
            in what it starts: then the words begin ``uv run``. ``torchrun`` sets ``TORCHELASTIC_RUN_ID``: then
            ``torchrun`` with the node and per-node process counts (``LOCAL_WORLD_SIZE``, ``GROUP_WORLD_SIZE``).
        argv0: ``sys.argv[0]``: the ``bionemo`` script as it was run. Its name alone when ``PATH`` finds that
            file by it, else the path as given; ``bionemo`` when it is some other program (a test, an API call).
        main_module: The module ``python -m`` ran (:func:`_main_module`), None for the ``bionemo`` script.
    """
    uv = "UV_RUN_RECURSION_DEPTH" in environ
    torchrun = "TORCHELASTIC_RUN_ID" in environ
    path = environ.get("PATH")
    if main_module is not None:
        python = "python" if uv else _as_typed("python", sys.executable, path)
        words = ["-m", main_module] if torchrun else [python, "-m", main_module]
    elif os.path.basename(argv0) != "bionemo":
        words = ["bionemo"]
    else:
        words = [argv0 if torchrun else _as_typed("bionemo", argv0, path)]  # torchrun takes a script's path
    if torchrun:
        nodes, per_node = environ.get("GROUP_WORLD_SIZE", "1"), environ.get("LOCAL_WORLD_SIZE", "1")
        words = ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={per_node}", *words]
    if uv:
        words = [_as_typed("uv", environ.get("UV", "uv"), path), "run", *words]
    return words


def _as_typed(name: str, program: str, path: str | None) -> str:
    """``name`` when ``path`` (a ``PATH`` value) finds ``program`` by it, else ``program`` itself."""
    found = shutil.which(name, path=path)
    if found is not None and os.path.abspath(found) == os.path.abspath(program):
        return name
    return program


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
    no_resume: NoResumeOpt = False,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Random seed (data split, masking, init). Default: 0.")
    ] = None,
) -> None:
    """Train (or fine-tune) the recipe's model; with no options, trains the demo on synthetic protein families."""
    overrides = _training_overrides(locals())
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
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace another run's predictions in --output-dir (default: refuse; the same run resumes).",
        ),
    ] = False,
) -> None:
    """Predict per-sequence outputs; with no options, the bundled demo sequences with the bundled weights."""
    overrides = {k: v for k, v in locals().items() if k not in ("config", "verbose")}
    overrides.update(truncate=truncate or None, overwrite=overwrite or None)  # unset flags (None): the config decides
    _run("predict", config, overrides, verbose)


@run_app.command()
def finetune(
    ctx: typer.Context,
    checkpoint: CkptOpt = None,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data", help="Labelled training CSV: a 'sequence' column, optionally 'id', the label column(s)."
        ),
    ] = None,
    val_data: Annotated[
        Path | None,
        typer.Option("--val-data", help="Labelled validation CSV. Default: a seeded 10% split of --data."),
    ] = None,
    task: Annotated[Task | None, typer.Option("--task", help="What the labels are.", case_sensitive=False)] = None,
    label_column: Annotated[
        list[str] | None,
        typer.Option("--label-column", help="Label column; repeat for several (regression, multilabel)."),
    ] = None,
    mask_column: Annotated[
        str | None, typer.Option("--mask-column", help="Per-residue 0/1 string; 0 = not scored (token tasks).")
    ] = None,
    head: Annotated[
        HeadChoice | None,
        typer.Option(
            "--head",
            help="hf: Hugging Face's layout (exports to EsmFor*Classification); mlp: mean over residues -> MLP; "
            "conv: convolution over residues (token tasks). Default: mlp for sequence tasks, conv for token tasks.",
            case_sensitive=False,
        ),
    ] = None,
    head_dropout: Annotated[
        float | None,
        typer.Option("--head-dropout", min=0.0, max=0.99, help="Dropout in the head. Default: 0.1 hf, 0.25 mlp/conv."),
    ] = None,
    encoder: Annotated[
        EncoderMode | None,
        typer.Option(
            "--encoder",
            help="full: train everything; frozen: the head only, on embeddings computed once; lora: LoRA adapters "
            "and the head. Default: full.",
            case_sensitive=False,
        ),
    ] = None,
    lora_rank: Annotated[int | None, typer.Option("--lora-rank", min=1, help="LoRA rank. Default: 8.")] = None,
    lora_alpha: Annotated[
        float | None,
        typer.Option("--lora-alpha", min=0.0, help="LoRA scale alpha (update x alpha / rank). Default: 16."),
    ] = None,
    lora_dropout: Annotated[
        float | None, typer.Option("--lora-dropout", min=0.0, max=0.99, help="Dropout on LoRA's input. Default: 0.")
    ] = None,
    lora_targets: Annotated[
        list[str] | None,
        typer.Option("--lora-targets", help=f"Repeat: layers to adapt among {', '.join(LORA_TARGETS)}. Default: all."),
    ] = None,
    head_lr: Annotated[
        float | None, typer.Option("--head-lr", min=0.0, help="The head's learning rate. Default: --lr.")
    ] = None,
    warmup_steps: Annotated[
        int | None, typer.Option("--warmup-steps", min=0, help="Linear warm-up steps. Default: 10% of --max-steps.")
    ] = None,
    patience: Annotated[
        int | None,
        typer.Option("--patience", min=1, help="Stop after this many validations without a better metric."),
    ] = None,
    recipe: RecipeOpt = None,
    config: ConfigOpt = None,
    output_dir: OutOpt = None,
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
    global_batch_tokens: Annotated[
        int | None,
        typer.Option(
            "--global-batch-tokens",
            min=1,
            help="Batches cut by tokens: up to this many per optimizer step, all devices (residues + 2 per sequence, "
            "no padding), instead of --micro-batch-size / --global-batch-size. Default: 16,384 on GPUs; on CPUs "
            "batches of 16 sequences.",
        ),
    ] = None,
    truncate: TruncateOpt = False,
    verbose: VerboseOpt = False,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", min=1, help="Optimizer steps. Default: 10 passes over --data.")
    ] = None,
    val_check_interval: Annotated[
        int | None, typer.Option("--val-check-interval", min=1, help="Steps between validations. Default: a pass.")
    ] = None,
    lr: Annotated[
        float | None,
        typer.Option("--lr", min=0.0, help="Peak learning rate. Default: 1e-4 full, 5e-4 lora, 1e-3 frozen."),
    ] = None,
    no_resume: NoResumeOpt = False,
    seed: Annotated[int | None, typer.Option("--seed", help="Random seed (split, order, init). Default: 0.")] = None,
) -> None:
    """Fine-tune a pretrained ESM-2 (--checkpoint) on labelled sequences; writes a self-describing model.safetensors."""
    overrides = _training_overrides(locals())
    for key in ("task", "head", "encoder"):
        if overrides[key] is not None:
            overrides[key] = overrides[key].value
    _run("finetune", config, overrides, verbose, ctx)
