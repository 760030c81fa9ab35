"""``bionemo run train``, ``run predict`` and ``run finetune``, recipe-driven; their shared options: ``shared_options``."""

import os
import shlex
import shutil
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from bionemo.cli.shared_options import (
    CHECKPOINT,
    CONFIG,
    LAYOUT_OPTIONS,
    OUTPUT_DIR,
    RECIPE,
    RUN_OPTIONS,
    TRUNCATE,
    VERBOSE,
    option,
    training_options,
    with_options,
)
from bionemo.esm2.finetune.class_weights import ClassWeighting
from bionemo.esm2.finetune.head_config import HeadChoice  # the standard library only: --help stays fast
from bionemo.esm2.finetune.spec import LORA_TARGETS, EncoderMode
from bionemo.esm2.finetune.tasks import Task
from bionemo.recipes.choices import Include, OutputDtype, WriteIntervalChoice

if TYPE_CHECKING:
    from bionemo.recipes.interrupts import TrainingAborted, TrainingInterrupted

__all__ = ["run_app"]

run_app = typer.Typer(help="Train a model or predict with one.", no_args_is_help=True)


def _training_overrides(options: dict[str, Any]) -> dict[str, Any]:
    """The settings a training command's options give (``run train``, ``run finetune``).

    Unset flags are None, so that ``--config`` decides them.
    """
    overrides = {k: v for k, v in options.items() if k not in ("config", "no_resume", "verbose")}
    overrides.update(truncate=options["truncate"] or None, resume=False if options["no_resume"] else None)
    return overrides


def _run(
    command: str, file: Path | None, overrides: dict[str, Any], verbose: bool = False, ctx: typer.Context | None = None
) -> None:
    from bionemo.core.library_chatter import quiet_libraries
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
@with_options(
    *RUN_OPTIONS,
    option(
        int | None,
        "--global-batch-tokens",
        min=1,
        help="Batches cut by tokens: up to this many per optimizer step, all devices (residues + 2 per sequence, no "
        "padding; similar lengths share a micro-batch), in micro-batches of up to --micro-batch-size x the model's "
        "sequence length tokens; instead of --global-batch-size. Default: on GPUs the recipe's global batch size x "
        "its sequence length (unless --global-batch-size is given); on CPUs batches by count.",
    ),
    *training_options(
        max_steps="Optimizer steps. Default: the recipe's.",
        val_check_interval="Steps between validations.",
        lr="Learning rate. Default: the recipe's.",
        seed="Random seed (data split, masking, init). Default: 0.",
    ),
)
def train(ctx: typer.Context, **options: Any) -> None:
    """Train (or fine-tune) the recipe's model; with no options, trains the demo on synthetic protein families."""
    _run("train", options["config"], _training_overrides(options), options["verbose"], ctx)


@run_app.command()
@with_options(
    *RUN_OPTIONS,
    option(
        list[Include] | None,
        "--include",
        help="Repeat to choose outputs (residue-embeddings: per residue; cls: the <cls> vector). Default: embeddings, "
        "perplexity.",
    ),
    option(
        WriteIntervalChoice | None,
        "--write-interval",
        help="batch: shards stream to disk as they come and a rerun resumes; epoch: one per device at the end. "
        "Default: batch.",
    ),
    option(
        int | None,
        "--tokens-per-batch",
        min=1,
        help="Batch length-sorted sequences up to this many tokens (padding included). Default: sized from the "
        "model and the device (up to 131,072 on GPUs, 8,192 on CPUs), or by count with --micro-batch-size.",
    ),
    option(
        list[int] | None,
        "--layer",
        help="Repeat to add layers' embeddings (0 = embedding output, num_layers = last, -1 = last).",
    ),
    option(OutputDtype | None, "--output-dtype", help="Type of written embeddings and logits. Default: float32."),
    option(
        bool | None,
        "--unpadded/--padded",
        show_default=False,
        help="Batches without padding (variable-length flash attention: GPUs in bf16/fp16, no model "
        "parallelism) or padded. Same outputs. Default: unpadded wherever it can run.",
    ),
    option(
        bool,
        "--overwrite",
        default=False,
        help="Replace another run's predictions in --output-dir (default: refuse; the same run resumes).",
    ),
)
def predict(**options: Any) -> None:
    """Predict per-sequence outputs; with no options, the bundled demo sequences with the bundled weights."""
    overrides = {k: v for k, v in options.items() if k not in ("config", "verbose")}
    # unset flags (None): the config decides
    overrides.update(truncate=options["truncate"] or None, overwrite=options["overwrite"] or None)
    _run("predict", options["config"], overrides, options["verbose"])


@run_app.command()
@with_options(
    CHECKPOINT,
    option(
        Path | None, "--data", help="Labelled training CSV: a 'sequence' column, optionally 'id', the label column(s)."
    ),
    option(Path | None, "--val-data", help="Labelled validation CSV. Default: a seeded 10% split of --data."),
    option(Task | None, "--task", help="What the labels are.", case_sensitive=False),
    option(list[str] | None, "--label-column", help="Label column; repeat for several (regression, multilabel)."),
    option(str | None, "--mask-column", help="Per-residue 0/1 string; 0 = not scored (token tasks)."),
    option(
        HeadChoice | None,
        "--head",
        help="hf: Hugging Face's layout (exports to EsmFor*Classification); mlp: mean over residues -> MLP; "
        "conv: convolution over residues (token tasks). Default: mlp for sequence tasks, conv for token tasks.",
        case_sensitive=False,
    ),
    option(
        float | None, "--head-dropout", min=0.0, max=0.99, help="Dropout in the head. Default: 0.1 hf, 0.25 mlp/conv."
    ),
    option(
        EncoderMode | None,
        "--encoder",
        help="full: train everything; frozen: the head only, on embeddings computed once; lora: LoRA adapters "
        "and the head. Default: full.",
        case_sensitive=False,
    ),
    option(int | None, "--lora-rank", min=1, help="LoRA rank. Default: 8."),
    option(float | None, "--lora-alpha", min=0.0, help="LoRA scale alpha (update x alpha / rank). Default: 16."),
    option(float | None, "--lora-dropout", min=0.0, max=0.99, help="Dropout on LoRA's input. Default: 0."),
    option(
        list[str] | None,
        "--lora-targets",
        help=f"Repeat: layers to adapt among {', '.join(LORA_TARGETS)}. Default: all.",
    ),
    option(float | None, "--head-lr", min=0.0, help="The head's learning rate. Default: --lr."),
    option(int | None, "--warmup-steps", min=0, help="Linear warm-up steps. Default: 10% of --max-steps."),
    option(
        ClassWeighting | None,
        "--class-weights",
        help="balanced: each class weighs n / (classes x its count) in the loss, for imbalanced classes "
        "(classification, token-classification; multilabel: each label's 1s and 0s). Default: none.",
        case_sensitive=False,
    ),
    option(
        str | None,
        "--best-metric",
        help="The validation metric that picks the exported weights (and --patience's): one the task logs, or "
        "loss. Default: mcc (classification), spearman (regression), auroc_macro (multilabel), accuracy "
        "(token-classification).",
    ),
    option(int | None, "--patience", min=1, help="Stop after this many validations without a better metric."),
    RECIPE,
    CONFIG,
    OUTPUT_DIR,
    *LAYOUT_OPTIONS,
    option(
        int | None,
        "--global-batch-tokens",
        min=1,
        help="Batches cut by tokens: up to this many per optimizer step, all devices (residues + 2 per sequence, "
        "no padding), one micro-batch per device, or with --micro-batch-size micro-batches of up to --micro-batch-size "
        "x the model's sequence length tokens (as run train); instead of --global-batch-size. Default: 16,384 on "
        "GPUs; on CPUs batches of 16 sequences.",
    ),
    TRUNCATE,
    VERBOSE,
    *training_options(
        max_steps="Optimizer steps. Default: 10 passes over --data.",
        val_check_interval="Steps between validations. Default: a pass.",
        lr="Peak learning rate. Default: 1e-4 full, 5e-4 lora, 1e-3 frozen.",
        seed="Random seed (split, order, init). Default: 0.",
    ),
)
def finetune(ctx: typer.Context, **options: Any) -> None:
    """Fine-tune a pretrained ESM-2 (--checkpoint) on labelled sequences; writes a self-describing model.safetensors."""
    overrides = _training_overrides(options)
    for key in ("task", "head", "encoder", "class_weights"):
        if overrides[key] is not None:
            overrides[key] = overrides[key].value
    _run("finetune", options["config"], overrides, options["verbose"], ctx)
