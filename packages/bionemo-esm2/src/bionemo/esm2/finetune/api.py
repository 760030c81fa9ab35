"""Fine-tune and predict from Python: sequences and labels as Python values, ``bionemo run finetune``'s run underneath.

:func:`finetune` and :meth:`FinetunedModel.predict` are ``bionemo run finetune`` and ``bionemo run predict``: the
same settings (:class:`~bionemo.recipes.settings.RunSettings`), checks, training and files. The caller writes no
file: the sequences and labels are written as the CLI's labelled CSV into a temporary folder and read back by
:func:`~bionemo.esm2.finetune.tasks.read_labelled_csv`, so every validation rule is the CLI's. Errors are the CLI's
:class:`~bionemo.recipes.settings.SettingsError` / :class:`~bionemo.esm2.data.readers.InputError` (``ValueError``
subclasses) with the temporary file's name replaced by the argument's: ``sequences[3]`` is ``sequences``' item 3
(from 0), ``val_sequences`` the validation set's.

Labels per sequence, by task (predictions decode to the same forms):

- ``classification``: the class name (``str``; other values are read as ``str(value)``);
- ``regression``: a number, or a tuple of numbers with ``label_columns`` naming the columns;
- ``multilabel``: a tuple of 0/1, one per ``label_columns`` entry;
- ``token-classification``: one label character per residue (a ``str`` such as ``"HHHCC"``);
- ``token-regression``: one number per residue (a list of floats).

Importing this module imports no torch.
"""

import csv
import json
import numbers
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bionemo.core.library_chatter import libraries_quieted
from bionemo.esm2.finetune.spec import FinetuneSpec
from bionemo.esm2.finetune.tasks import Task
from bionemo.esm2.python_runs import (
    RECIPE,
    SequenceInput,
    named_inputs,
    predicted,
    prediction_options,
    quiet_imports,
    run_settings,
    sequence_pairs,
    write_rows,
)
from bionemo.recipes.choices import Accelerator, Precision
from bionemo.recipes.settings import SettingsError

__all__ = ["FinetunedModel", "Predictions", "finetune"]

Label = str | float | tuple[float, ...] | Sequence[float]
"""One sequence's label(s): the module docstring lists the form of each task."""

_MASK_COLUMN = "mask"


@dataclass(frozen=True, kw_only=True, slots=True)
class Predictions:
    """A fine-tuned model's predictions for ``n`` sequences, in input order.

    ``labels[i]`` is sequence ``i``'s ``predictions.csv`` row decoded to the task's label form (the module
    docstring); ``outputs`` the head's outputs as ``predictions.safetensors`` holds them, sequence tasks
    ``[n, k]``, token tasks a list of ``[L_i, k]`` (token-classification) or ``[L_i]`` (token-regression) tensors.
    """

    ids: list[str]
    """Sequence ids: the ``(id, sequence)`` pairs' ids, else ``row1``, ``row2``, ... (as a CSV without ``id``)."""
    labels: list[Any]
    """The predicted label(s) per sequence: class name, number(s), 0/1 tuple, label string or list of numbers."""
    outputs: Any
    """``probabilities`` (classification, multilabel, token-classification) or ``values`` (the regressions)."""
    names: tuple[str, ...]
    """What the outputs' last dimension means: the class names, the multilabel or the regression columns."""
    tensors: dict[str, Any] = field(default_factory=dict)
    """Every tensor of ``predictions.safetensors`` (also ``include``'s embeddings, flat ``residue_offsets``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FinetunedModel:
    """A fine-tuned model file (``model.safetensors``) and what it was trained for."""

    path: Path
    """The model file (or a Hugging Face ``EsmFor*Classification`` folder)."""
    spec: FinetuneSpec
    """Task, head, labels, encoder mode and LoRA shape."""
    metrics: dict[str, Any]
    """From the file's metadata: ``best`` (metric, value, step of the exported weights), ``final_metrics`` (the
    last validation's) and ``steps``; empty for a Hugging Face folder."""
    _workdir: Any = field(default=None, repr=False, compare=False)
    """The temporary run folder holding ``path`` when :func:`finetune` had no ``output_dir``; it is deleted with
    this object (keep the model with :meth:`save`)."""

    @classmethod
    def load(cls, path: str | Path) -> "FinetunedModel":
        """The fine-tuned model at ``path`` (what ``bionemo run finetune`` wrote, or a Hugging Face folder).

        Raises:
            SettingsError: What ``--checkpoint`` refuses (missing, damaged, wrong tensors), or a pretrained model
                (it has no task head).
        """
        from bionemo.esm2.recipes.inputs import checked_checkpoint_header

        header = checked_checkpoint_header(Path(path))
        spec = getattr(header, "finetune", None)
        if spec is None:
            raise SettingsError(
                f"{path} is a pretrained model without a task head; fine-tune it first (bionemo.esm2.finetune.api."
                "finetune or `bionemo run finetune`)",
                "--checkpoint",
            )
        metrics = {key: header.metadata[key] for key in ("best", "final_metrics", "steps") if key in header.metadata}
        return cls(path=Path(path), spec=spec, metrics=metrics)

    def save(self, path: str | Path) -> "FinetunedModel":
        """Copy the model file to ``path`` (a ``.safetensors`` file); the model there."""
        if self.path.is_dir():
            raise ValueError(f"{self.path} is a Hugging Face folder; copy the folder itself")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.path, target)
        return FinetunedModel(path=target, spec=self.spec, metrics=self.metrics)

    def predict(
        self,
        sequences: Sequence[SequenceInput],
        *,
        include: Sequence[str] = (),
        truncate: bool = False,
        micro_batch_size: int | None = None,
        tokens_per_batch: int | None = None,
        accelerator: Accelerator | str = Accelerator.AUTO,
        devices: int = 1,
        precision: Precision | str | None = None,
        verbose: bool = False,
    ) -> Predictions:
        """Predict ``sequences`` as ``bionemo run predict --checkpoint <path>`` does, in this process.

        Args:
            sequences: Protein sequences, or ``(id, sequence)`` pairs.
            include: Encoder outputs to add to :attr:`Predictions.tensors`: ``embeddings``, ``residue-embeddings``,
                ``cls`` (``--include``).
            truncate: Cut sequences longer than the model's context instead of refusing them.
            micro_batch_size: Sequences per batch (``--micro-batch-size``).
            tokens_per_batch: Length-sorted batches of at most this many tokens (``--tokens-per-batch``).
            accelerator: ``auto``, ``cpu`` or ``gpu``.
            devices: Devices to predict on.
            precision: ``32``, ``bf16-mixed``, ...; default: the CLI's (bf16 on GPUs, fp32 on the CPU).
            verbose: Let the libraries' warnings and log lines through (``--verbose``); by default they are hidden
                as ``bionemo run`` hides them, during the call only.

        Raises:
            SettingsError: What ``bionemo run predict`` refuses (messages name ``sequences[i]``).
            TypeError: ``sequences`` is a string or holds something other than strings and pairs.
        """
        options = prediction_options(
            self.path,
            truncate=truncate,
            micro_batch_size=micro_batch_size,
            tokens_per_batch=tokens_per_batch,
            accelerator=accelerator,
            devices=devices,
            precision=precision,
        )
        if include:
            options["include"] = list(include)
        with predicted(sequences, options, verbose=verbose) as out:
            return _read_predictions(out, self.spec)


def finetune(
    checkpoint: str | Path,
    sequences: Sequence[SequenceInput],
    labels: Sequence[Label],
    *,
    task: Task | str,
    label_columns: Sequence[str] | None = None,
    masks: Sequence[str | Sequence[bool]] | None = None,
    val_sequences: Sequence[SequenceInput] | None = None,
    val_labels: Sequence[Label] | None = None,
    val_masks: Sequence[str | Sequence[bool]] | None = None,
    val_fraction: float = 0.1,
    head: str | None = None,
    encoder: str = "full",
    lora_rank: int | None = None,
    lora_alpha: float | None = None,
    lora_dropout: float | None = None,
    lora_targets: Sequence[str] = (),
    max_steps: int | None = None,
    val_check_interval: int | None = None,
    lr: float | None = None,
    head_lr: float | None = None,
    warmup_steps: int | None = None,
    patience: int | None = None,
    class_weights: str | None = None,
    best_metric: str | None = None,
    micro_batch_size: int | None = None,
    global_batch_size: int | None = None,
    truncate: bool = False,
    output_dir: str | Path | None = None,
    resume: bool = True,
    accelerator: Accelerator | str = Accelerator.AUTO,
    devices: int = 1,
    precision: Precision | str | None = None,
    seed: int = 0,
    verbose: bool = False,
) -> FinetunedModel:
    """Fine-tune the pretrained ``checkpoint`` on labelled sequences: ``bionemo run finetune`` in this process.

    Every keyword is the CLI option of the same name (``label_columns`` is ``--label-column``, ``masks`` the
    ``--mask-column``'s values) with the CLI's defaults; ``bionemo run finetune --help`` says what each does.

    Args:
        checkpoint: The base: a Hugging Face ESM-2 folder or a bionemo ``model.safetensors``.
        sequences: Protein sequences, or ``(id, sequence)`` pairs.
        labels: One label per sequence, in the task's form (the module docstring).
        task: ``regression``, ``classification``, ``multilabel``, ``token-classification``, ``token-regression``.
        label_columns: Names of the label columns (``predictions.csv``'s columns, the outputs' names for
            regression and multilabel); default ``("label",)``. Multilabel and several regression values need them.
        masks: Token tasks: per sequence one 0/1 per residue (a ``"1101"`` string or booleans); 0 = not scored.
        val_sequences: Validation sequences; without them a seeded ``val_fraction`` of ``sequences`` is held out.
        val_labels: The validation labels (with ``val_sequences``).
        val_masks: The validation masks (with ``val_sequences`` and ``masks``).
        val_fraction: The held-out share without ``val_sequences``.
        head: ``hf``, ``mlp`` or ``conv``; default: mlp for sequence tasks, conv for token tasks.
        encoder: ``full``, ``frozen`` or ``lora``.
        lora_rank: LoRA's rank (``encoder="lora"``); ``lora_alpha``, ``lora_dropout``, ``lora_targets`` likewise.
        lora_alpha: LoRA's scale numerator.
        lora_dropout: Dropout on LoRA's input.
        lora_targets: Layers to adapt (``qkv``, ``proj``, ``fc1``, ``fc2``).
        max_steps: Optimizer steps; default 10 passes over the training set.
        val_check_interval: Steps between validations; default one per pass.
        lr: Learning rate; default by ``encoder`` (1e-4 full, 5e-4 lora, 1e-3 frozen).
        head_lr: The head's learning rate; default ``lr``.
        warmup_steps: Linear warm-up steps; default 10% of ``max_steps``.
        patience: Stop after this many validations without improvement; default never.
        class_weights: ``"balanced"``: each class weighs ``n / (classes * its count)`` in the loss (classification,
            token-classification; multilabel: each label's 1s and 0s); default none.
        best_metric: The validation metric that picks the exported weights (a name the task logs, or ``"loss"``);
            default the task's (mcc, spearman, auroc_macro, accuracy).
        micro_batch_size: Sequences per micro-batch; default 16.
        global_batch_size: Sequences per optimizer step; default 16.
        truncate: Cut sequences (and per-residue labels) longer than the model's context instead of refusing them.
        output_dir: Where the run goes (``model.safetensors``, logs, checkpoints, ``summary.json``); an existing
            run there is resumed as the CLI does. Default: a temporary folder deleted with the returned model.
        resume: Continue the run in ``output_dir`` from its checkpoints (the same sequences, labels and settings
            that define it; another run's checkpoints there are refused with a ``SettingsError``). False (the CLI's
            ``--no-resume``) removes them and starts afresh.
        accelerator: ``auto``, ``cpu`` or ``gpu``.
        devices: Devices to train on (more than one: give ``output_dir`` and run from a script, which Lightning's
            launcher starts once per device).
        precision: ``32``, ``bf16-mixed``, ...; default bf16 on GPUs, fp32 on the CPU.
        seed: Seeds the validation split, the data order and the head's initialisation.
        verbose: Let the libraries' warnings and log lines through (``--verbose``); by default the ones
            ``bionemo run`` hides are hidden during the call, and the process's warning filters and loggers are
            as they were afterwards.

    Returns:
        The exported model (the best validation's weights) with its spec and metrics.

    Raises:
        SettingsError: What ``bionemo run finetune`` refuses: options, the base checkpoint, bad labels or
            sequences (``sequences[i]`` / ``val_sequences[i]`` name them), one class only, unseen validation
            classes, another run's checkpoints in ``output_dir``. A ``ValueError``.
        ValueError: ``labels`` (or ``masks``) not one per sequence; validation labels without validation
            sequences; several processes without ``output_dir``.
        TypeError: ``sequences`` is a string or holds something other than strings and pairs.
    """
    with quiet_imports(verbose):  # some libraries warn while they are imported
        from bionemo.esm2.finetune.options import finetune_options
        from bionemo.esm2.finetune.tasks import OptionError
        from bionemo.esm2.finetune.train import finetune as run_finetune
        from bionemo.esm2.recipes import demo

    if (val_labels is None) != (val_sequences is None) or (val_masks is not None and val_sequences is None):
        raise ValueError("val_sequences and val_labels (and val_masks) come together; give both or neither")
    if devices > 1 and output_dir is None:
        raise ValueError(f"devices={devices}: give output_dir, which every training process writes to")
    given = {
        "checkpoint": Path(checkpoint),
        "task": str(task),
        "label_column": _label_columns(task, label_columns, labels),
        "mask_column": _MASK_COLUMN if masks is not None else None,
        "val_fraction": val_fraction,
        "head": None if head is None else str(head),
        "encoder": str(encoder),
        "lora_rank": lora_rank,
        "lora_alpha": lora_alpha,
        "lora_dropout": lora_dropout,
        "lora_targets": list(lora_targets),
        "max_steps": max_steps,
        "val_check_interval": val_check_interval,
        "lr": lr,
        "head_lr": head_lr,
        "warmup_steps": warmup_steps,
        "patience": patience,
        "class_weights": class_weights,
        "best_metric": best_metric,
        "micro_batch_size": micro_batch_size,
        "global_batch_size": global_batch_size,
        "truncate": truncate,
        "accelerator": str(accelerator),
        "devices": devices,
        "precision": None if precision is None else str(precision),
        "seed": seed,
        "resume": resume,
    }
    workdir = tempfile.TemporaryDirectory(prefix="bionemo_finetune_") if output_dir is None else None
    out = Path(workdir.name if workdir is not None else output_dir)  # type: ignore[arg-type]
    try:
        with tempfile.TemporaryDirectory(prefix="bionemo_finetune_data_") as folder:
            data, val = Path(folder) / "sequences.csv", Path(folder) / "val_sequences.csv"
            has_val = val_sequences is not None and val_labels is not None
            settings = run_settings({**given, "data": data, "val_data": val if has_val else None, "output_dir": out})
            try:
                options = finetune_options(settings)  # the CLI's checks of task, columns, head, encoder, LoRA
            except OptionError as error:
                raise SettingsError(str(error), error.option) from None
            _write_labelled(data, options.task, options.label_columns, sequences, labels, masks, "sequences")
            if val_sequences is not None and val_labels is not None:
                _write_labelled(
                    val, options.task, options.label_columns, val_sequences, val_labels, val_masks, "val_sequences"
                )
            with named_inputs({data: "sequences", val: "val_sequences"}), libraries_quieted(verbose):
                run_finetune(settings, defaults=demo().defaults, recipe=RECIPE)
        model = FinetunedModel.load(out / "model.safetensors")
    except BaseException:
        if workdir is not None:
            workdir.cleanup()  # a refused or failed run leaves nothing behind
        raise
    return FinetunedModel(path=model.path, spec=model.spec, metrics=model.metrics, _workdir=workdir)


def _label_columns(task: Task | str, given: Sequence[str] | None, labels: Sequence[Label]) -> list[str]:
    """The label columns: ``given``, else ``["label"]`` where one value per sequence is the label.

    Without ``given`` a multilabel task, or a regression with several values per sequence, gets none: the CLI's
    check then asks for them.
    """
    if isinstance(given, str):
        return [given]
    if given is not None:
        return list(given)
    name = str(task).strip().lower()
    several = name == Task.MULTILABEL or (
        name == Task.REGRESSION and any(isinstance(label, tuple | list) and len(label) != 1 for label in labels)
    )
    return [] if several else ["label"]


def _write_labelled(
    path: Path,
    task: Task,
    columns: Sequence[str],
    sequences: Sequence[SequenceInput],
    labels: Sequence[Label],
    masks: Sequence[str | Sequence[bool]] | None,
    name: str,
) -> Path:
    """Write sequences, labels and masks as the CLI's labelled CSV (``tasks``' module docstring)."""
    pairs = sequence_pairs(sequences, name)
    label_name = "labels" if name == "sequences" else "val_labels"
    mask_name = "masks" if name == "sequences" else "val_masks"
    if isinstance(labels, str) or len(labels) != len(pairs):
        got = "a str" if isinstance(labels, str) else f"{len(labels)}"
        raise ValueError(f"{label_name}: give one label per sequence; got {got} for {len(pairs)} sequences")
    if masks is not None and len(masks) != len(pairs):
        raise ValueError(f"{mask_name}: give one mask per sequence; got {len(masks)} for {len(pairs)} sequences")
    rows = []
    for i, (pair, label) in enumerate(zip(pairs, labels, strict=True)):
        cells = _label_cells(task, label, len(columns), f"{label_name}[{i}]")
        mask = [] if masks is None else [_mask_cell(masks[i])]
        rows.append([*pair, *cells, *mask])
    header = ["id", "sequence", *columns, *([_MASK_COLUMN] if masks is not None else [])]
    return write_rows(path, header, rows)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    """One value as a CSV cell: numbers exactly (``repr`` of the float), booleans 1/0, ``None`` empty, else ``str``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(int(value))
    if _is_number(value):
        number = float(value)
        return str(int(number)) if number.is_integer() and abs(number) < 2**53 else repr(number)
    return str(value)


def _label_cells(task: Task, label: Label, width: int, where: str) -> list[str]:
    """One sequence's label cells as the CLI's CSV holds them.

    A value of the wrong kind (text for a number, 0.5 for multilabel) becomes a cell the reader refuses with its
    message (:func:`~bionemo.esm2.finetune.tasks.read_labelled_csv`).

    Raises:
        ValueError: A sequence task's label with more or fewer values than ``width`` label columns.
    """
    if task.per_residue:
        if isinstance(label, str):
            return [label]
        parts = list(label) if isinstance(label, Sequence) else [label]  # type: ignore[arg-type]
        joiner = "" if task is Task.TOKEN_CLASSIFICATION else " "
        return [joiner.join(_cell(part) for part in parts)]
    values = list(label) if isinstance(label, tuple | list) else [label]
    if len(values) != width:
        raise ValueError(f"{where} is {label!r}, {len(values)} value(s); give {width}, one per label column")
    if task is Task.CLASSIFICATION:
        return ["" if values[0] is None else str(values[0])]  # a class name, True as 'True'
    return [_cell(value) for value in values]


def _mask_cell(mask: str | Sequence[bool]) -> str:
    if isinstance(mask, str):
        return mask
    return "".join("1" if m is True or m == 1 else "0" if m is False or m == 0 else _cell(m) for m in mask)


def _read_predictions(out: Path, spec: FinetuneSpec) -> Predictions:
    """``predictions.safetensors`` and ``predictions.csv`` of a fine-tuned model's run, decoded."""
    from safetensors import safe_open

    from bionemo.esm2.finetune.predict import LABELS_KEY, PREDICTIONS_CSV, output_key
    from bionemo.esm2.recipes.prediction_shards import PREDICTIONS
    from bionemo.recipes.outputs import read_predictions, split_residues

    ids, tensors = read_predictions(out / PREDICTIONS)
    with safe_open(str(out / PREDICTIONS), framework="pt") as f:
        names = tuple(json.loads((f.metadata() or {})[LABELS_KEY]))
    key = output_key(spec.task)
    outputs = split_residues(tensors, key) if spec.task.per_residue else tensors[key]
    with (out / PREDICTIONS_CSV).open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    labels = [_decoded(spec, [row[column] for column in spec.labels.columns]) for row in rows]
    return Predictions(ids=ids, labels=labels, outputs=outputs, names=names, tensors=tensors)


def _decoded(spec: FinetuneSpec, cells: list[str]) -> Any:
    """One ``predictions.csv`` row's cells in the task's label form (the module docstring)."""
    task = spec.task
    if task in (Task.CLASSIFICATION, Task.TOKEN_CLASSIFICATION):
        return cells[0]
    if task is Task.MULTILABEL:
        return tuple(int(cell) for cell in cells)
    if task is Task.TOKEN_REGRESSION:
        return [float(value) for value in cells[0].split()]
    values = tuple(float(cell) for cell in cells)
    return values[0] if len(values) == 1 else values
