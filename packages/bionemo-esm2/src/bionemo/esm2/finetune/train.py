"""``bionemo run finetune``: train a task head (and the encoder, its LoRA adapters, or neither) on labelled CSVs.

Every check that needs no tensor runs first (options, the base checkpoint's headers, both CSV files, the layout,
the output folder), so bad input is refused in about a second with nothing written. Then the base weights are
read, the model is trained with AdamW under a warm-up + cosine schedule on every layout ``run train`` supports,
the task's validation metrics are logged at every check, and the weights of the best validation are exported as a
self-describing ``model.safetensors`` (:mod:`bionemo.esm2.finetune.spec`).
"""

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bionemo.esm2.finetune.class_weights import ClassWeighting, ClassWeights
from bionemo.esm2.finetune.options import DEFAULT_LR, FinetuneOptions, finetune_options
from bionemo.esm2.finetune.spec import EncoderMode, FinetuneSpec
from bionemo.esm2.finetune.tasks import (
    LabelledData,
    LabelledRecord,
    LabelVocabulary,
    OptionError,
    read_labelled_csv,
    split,
)
from bionemo.esm2.recipes.inputs import checked_checkpoint, checked_checkpoint_header
from bionemo.esm2.recipes.token_steps import TokenSteps, token_steps
from bionemo.esm2.tokenizer import encoded_length
from bionemo.recipes.choices import Precision
from bionemo.recipes.registry import RecipeDefaults, SummaryRows
from bionemo.recipes.settings import RunSettings, SettingsError

__all__ = [
    "FINETUNE_EPOCHS",
    "FINETUNE_TOKENS",
    "LORA_RECOMPUTE_SHARE",
    "finetune",
    "finetune_defaults",
    "lora_recompute",
    "read_labelled_data",
    "token_budget",
    "token_split",
]

FINETUNE_EPOCHS = 10
"""Passes over the training set when ``--max-steps`` is not given."""


def read_labelled_data(settings: RunSettings, options: FinetuneOptions, max_residues: int) -> LabelledData:
    """Read ``--data`` and ``--val-data`` (or split ``--data``) and build the label vocabulary from training.

    Raises:
        SettingsError: Any problem of either file (``--data`` / ``--val-data``), one class only, a validation label
            the training set lacks.
    """
    from bionemo.esm2.data.readers import InputError

    if settings.data is None:
        raise SettingsError(
            "fine-tuning needs labelled data: give --data train.csv (a 'sequence' column, optionally 'id', and the "
            "label column(s))",
            "--data",
        )

    def read(path: Path, option: str) -> list[LabelledRecord]:
        try:
            return read_labelled_csv(
                path, options.task, options.label_columns, options.mask_column, max_residues, settings.truncate
            )
        except OptionError as error:
            raise SettingsError(str(error), error.option) from None
        except InputError as error:
            raise SettingsError(str(error), option) from None

    records = read(settings.data, "--data")
    if settings.val_data is None:
        try:
            train, val = split(records, settings.val_fraction, settings.seed, task=options.task)
        except InputError as error:
            raise SettingsError(str(error), "--data") from None
    else:
        train, val = records, read(settings.val_data, "--val-data")
    try:
        vocabulary = LabelVocabulary.from_records(options.task, options.label_columns, train, settings.data)
        vocabulary.check_unseen(val, settings.val_data or settings.data)
    except InputError as error:
        raise SettingsError(str(error), "--val-data" if settings.val_data is not None else "--data") from None
    return LabelledData(train=train, val=val, vocabulary=vocabulary, split_from_train=settings.val_data is None)


def finetune_defaults(
    recipe: RecipeDefaults,
    model: dict[str, Any],
    options: FinetuneOptions,
    train: list[LabelledRecord],
    *,
    steps: TokenSteps | None = None,
) -> RecipeDefaults:
    """Fine-tuning's run defaults: :data:`FINETUNE_EPOCHS` passes, a validation per pass, bf16, and the batches.

    Batches of 16 sequences, or with ``steps`` (:func:`token_split`) global batches cut by tokens: items are then
    micro-batches, ``steps.parts`` per step (``micro_batch_size`` 1, ``global_batch_size`` ``steps.parts``), and a
    pass is the training tokens over ``steps.budget`` steps. The learning rate depends on what trains
    (:data:`~bionemo.esm2.finetune.options.DEFAULT_LR`); the model settings are the base checkpoint's.
    """
    if steps is None:
        micro, global_batch = 16, 16
        per_pass = max(1, math.ceil(len(train) / global_batch))
    else:
        micro, global_batch = 1, steps.parts
        per_pass = max(1, math.ceil(sum(encoded_length(r.sequence) for r in train) / steps.budget))
    return replace(
        recipe,
        micro_batch_size=micro,
        global_batch_size=global_batch,
        max_steps=FINETUNE_EPOCHS * per_pass,
        val_check_interval=per_pass,
        lr=DEFAULT_LR[options.encoder],
        precision=Precision.BF16,
        model=model,
        cpu=None,
    )


def finetune(settings: RunSettings, *, defaults: RecipeDefaults, recipe: str) -> SummaryRows:
    """Fine-tune the ``--checkpoint`` base on ``--data``; export ``model.safetensors``; the summary rows.

    ``defaults`` are the recipe's; fine-tuning replaces their run length, batches and learning rate
    (:func:`finetune_defaults`) and takes the model's shape from the base checkpoint.
    """
    from bionemo.recipes.resolved import resolved_training_settings, save_settings, training_plan
    from bionemo.recipes.run_record import check_resumable, refuse_prediction_folder, run_identity, start_run_record
    from bionemo.recipes.trainers import accelerator, check_hardware, check_output_dir, is_launching_rank, uses_megatron

    try:
        options = finetune_options(settings)
    except OptionError as error:
        raise SettingsError(str(error), error.option) from None
    if settings.checkpoint is None:
        raise SettingsError(
            "fine-tuning starts from a pretrained model: give --checkpoint (a Hugging Face ESM-2 folder or a bionemo "
            "model.safetensors)",
            "--checkpoint",
        )
    header = checked_checkpoint_header(settings.checkpoint)
    if getattr(header, "finetune", None) is not None:
        raise SettingsError(
            f"{settings.checkpoint} is a fine-tuned model; fine-tuning starts from a pretrained ESM-2 (the base it "
            "was fine-tuned from, or any Hugging Face ESM-2 folder)",
            "--checkpoint",
        )
    if settings.pipeline_parallel > 1 or settings.context_parallel > 1:
        raise SettingsError(
            "fine-tuning runs with data and tensor parallelism (--devices, --tensor-parallel); pipeline and context "
            "parallelism are for pretraining long sequences: leave --pipeline-parallel and --context-parallel at 1",
            "--pipeline-parallel" if settings.pipeline_parallel > 1 else "--context-parallel",
        )
    model = {**header.model, **_model_overrides(settings, header.model)}
    data = read_labelled_data(settings, options, model["seq_length"] - 2)
    spec = FinetuneSpec(
        task=options.task, head=options.head, labels=data.vocabulary, encoder=options.encoder, lora=options.lora
    )
    out = settings.output_dir or Path("bionemo_runs") / "finetune"
    check_hardware(settings)
    gpu = accelerator(settings) == "gpu"
    tokens = token_budget(settings, gpu=gpu)
    steps = None if tokens is None else token_split(settings, tokens, data, model["seq_length"])
    run_defaults = finetune_defaults(defaults, model, options, data.train, steps=steps)
    given = settings
    if steps is not None:  # items are micro-batches now: the cap was used for the split
        settings = settings.model_copy(update={"micro_batch_size": None})
    settings = resolved_training_settings(settings, run_defaults, gpu=gpu)
    if steps is not None:
        settings = settings.model_copy(update={"global_batch_tokens": steps.budget})
    _check_lora_layout(spec, settings)
    if spec.lora is not None and uses_megatron(settings):
        run_defaults = replace(run_defaults, model=lora_recompute(run_defaults.model))
    check_output_dir(out, create=False)
    refuse_prediction_folder(out)
    weights = None
    if options.class_weights is ClassWeighting.BALANCED:
        weights = ClassWeights.balanced(spec.task, data.train, data.vocabulary)
    extra: dict[str, Any] = {"model": model, "data": _data_identity(data), "finetune": spec.to_json()}
    if weights is not None:  # only then: runs before the option existed keep their identity
        extra["class_weights"] = str(options.class_weights)
    if options.best is not None:  # the exported weights' choice; checkpoints keep its best value
        extra["best_metric"] = options.best.key
    identity = run_identity(settings, extra)
    megatron = spec.encoder is not EncoderMode.FROZEN and uses_megatron(settings)  # frozen: Lightning's strategies
    resume_from = check_resumable(settings, out / "checkpoints", identity, megatron=megatron)
    start = checked_checkpoint(header.path)  # the tensors: NaN/Inf
    check_output_dir(out)
    if is_launching_rank():
        start_run_record(settings, out / "checkpoints", identity)
        by_count = {} if steps is None else {"micro_batch_size": given.micro_batch_size, "global_batch_size": None}
        save_settings(settings.model_copy(update={"output_dir": out, **by_count}), out, training=True, finetuning=True)
        plan = (
            training_plan(given, settings, run_defaults, gpu=gpu)
            if steps is None
            else f"{settings.max_steps} steps x {steps.label()}"
        )
        print(f"Fine-tuning ({spec.task}, {spec.head.kind} head, encoder {spec.encoder}): {plan}", flush=True)
    from bionemo.esm2.finetune.fit import fit

    return fit(settings, run_defaults, recipe, spec, data, out, start, resume_from, weights, options.best_metric)


FINETUNE_TOKENS = 16_384
"""Tokens per global batch of a fine-tuning run on GPUs when no batch size is given."""


def token_budget(settings: RunSettings, *, gpu: bool) -> int | None:
    """Tokens per global batch, or None for batches by count.

    ``--global-batch-tokens`` as given (with ``--micro-batch-size`` as the cap of a micro-batch, see
    :func:`token_split`); on GPUs without any batch size :data:`FINETUNE_TOKENS` (a handful of ~300-residue
    proteins per step leaves a GPU waiting for the host); on CPUs, or with ``--micro-batch-size`` /
    ``--global-batch-size`` alone, batches by count.

    Raises:
        SettingsError: ``--global-batch-tokens`` with ``--global-batch-size``.
    """
    tokens = settings.global_batch_tokens
    if tokens is not None and settings.global_batch_size:
        raise SettingsError(
            "--global-batch-tokens cuts batches by tokens, --global-batch-size by count: give one or the other",
            "--global-batch-tokens",
        )
    if tokens is None and (settings.micro_batch_size or settings.global_batch_size or not gpu):
        return None
    return tokens or FINETUNE_TOKENS


def token_split(settings: RunSettings, tokens: int, data: LabelledData, seq_length: int) -> TokenSteps:
    """How a step of up to ``tokens`` is split into micro-batches, as ``run train`` splits its steps.

    With ``--micro-batch-size`` micro-batches hold up to that many times ``seq_length`` tokens on average (each rank
    accumulates as many as that takes: :func:`bionemo.esm2.recipes.token_steps.token_steps`); without it each
    data-parallel rank takes its share of the step as one micro-batch.

    Raises:
        SettingsError: A budget or cap that cannot give every micro-batch two of the longest sequences, or fewer
            sequences than micro-batches in a step.
    """
    lengths: dict[str, Sequence[int]] = {
        "training": [encoded_length(r.sequence) for r in data.train],
        "validation": [encoded_length(r.sequence) for r in data.val],
    }
    if settings.micro_batch_size is not None:
        steps = token_steps(settings.model_copy(update={"global_batch_tokens": tokens}), seq_length, lengths)
        assert steps is not None  # a budget was given
        return steps
    ranks = settings.data_parallel_size()
    longest = max(max(sizes) for sizes in lengths.values())
    if tokens < 2 * ranks * longest:
        raise SettingsError(
            f"--global-batch-tokens {tokens} cannot give each of {ranks} data-parallel rank(s) two of the longest "
            f"sequences ({longest} tokens with <cls> and <eos>): give at least {2 * ranks * longest}, or batch by "
            "count with --global-batch-size",
            "--global-batch-tokens",
        )
    for name, sizes in lengths.items():
        if len(sizes) < ranks:
            raise SettingsError(
                f"{len(sizes)} {name} sequences cannot fill a batch on each of {ranks} data-parallel ranks",
                "--devices",
            )
    return TokenSteps(tokens, micro_tokens=tokens, data_parallel=ranks)  # one micro-batch per rank and step


LORA_RECOMPUTE_SHARE = 1 / 4
"""Share of the layers whose activations a LoRA run on GPUs recomputes in the backward pass instead of keeping."""


def lora_recompute(model: Mapping[str, Any]) -> Mapping[str, Any]:
    """``model`` with megatron's activation recomputation of the first :data:`LORA_RECOMPUTE_SHARE` of the layers.

    LoRA is chosen to fit in less memory: with the base frozen its optimizer state is tiny and the activations are
    most of the peak. Recomputing whole layers (megatron's ``recompute_granularity="full"``, ``"block"`` method) for
    that share of them brings a LoRA run's peak memory down to the target share of full fine-tuning's, for one more
    forward pass of those layers (docs/benchmarks.md#fine-tuning). ``model:`` settings of a ``--config`` that set
    any recomputation win.
    """
    if any(key.startswith("recompute_") for key in model):
        return model
    layers = max(1, round(int(model["num_layers"]) * LORA_RECOMPUTE_SHARE))
    return {**model, "recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": layers}


def _data_identity(data: LabelledData) -> dict[str, Any]:
    """The training and validation records' digests (ids, sequences, labels, masks), for the run's identity."""
    from bionemo.recipes.run_record import split_digests

    def rows(records: list[LabelledRecord]) -> Iterator[tuple[Any, ...]]:
        return ((r.id, r.sequence, r.labels, r.mask) for r in records)

    return split_digests(rows(data.train), rows(data.val))


def _model_overrides(settings: RunSettings, base: dict[str, Any]) -> dict[str, Any]:
    """The ``model:`` settings of a ``--config`` file, e.g. megatron's activation recomputation.

    They may repeat the base checkpoint's shape, not change it.

    Raises:
        SettingsError: An unknown key (:func:`bionemo.esm2.recipes.model_settings.checked_model_settings`), or a
            shape setting that differs from the base checkpoint's.
    """
    from bionemo.esm2.recipes.model_settings import SHAPE_KEYS, checked_model_settings

    given = checked_model_settings(dict(settings.model or {}))
    changed = [k for k in (*SHAPE_KEYS, "seq_length", "vocab_size") if k in given and given[k] != base.get(k)]
    if changed:
        raise SettingsError(
            "model settings "
            + ", ".join(f"{k}={given[k]!r}" for k in changed)
            + " differ from the base checkpoint's "
            + ", ".join(f"{k}={base.get(k)!r}" for k in changed)
            + "; fine-tuning keeps the base's shape",
            "--config",
        )
    return given


def _check_lora_layout(spec: FinetuneSpec, settings: RunSettings) -> None:
    """LoRA's rank splits over tensor-parallel ranks on column-parallel layers (qkv, fc1)."""
    if spec.lora is None or settings.tensor_parallel == 1:
        return
    if {"qkv", "fc1"} & set(spec.lora.targets) and spec.lora.rank % settings.tensor_parallel:
        raise SettingsError(
            f"--lora-rank {spec.lora.rank} must be a multiple of --tensor-parallel {settings.tensor_parallel} for the "
            "column-parallel targets (qkv, fc1)",
            "--lora-rank",
        )
