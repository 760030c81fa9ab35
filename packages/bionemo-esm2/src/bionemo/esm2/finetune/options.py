"""The fine-tuning options of ``bionemo run finetune``, checked together before any file is read or torch imported."""

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from bionemo.esm2.finetune.class_weights import WEIGHTED_TASK_NAMES, WEIGHTED_TASKS, ClassWeighting
from bionemo.esm2.finetune.head_config import HeadChoice, HeadConfig, head_config
from bionemo.esm2.finetune.metric_names import BEST_METRIC, BestMetric, best_metric
from bionemo.esm2.finetune.spec import LORA_TARGETS, EncoderMode, LoRASettings
from bionemo.esm2.finetune.tasks import OptionError, Task, check_label_options
from bionemo.recipes.settings import RunSettings

__all__ = ["DEFAULT_HEAD", "DEFAULT_LR", "FinetuneOptions", "finetune_options"]

DEFAULT_HEAD: dict[Task, HeadChoice] = {
    Task.REGRESSION: HeadChoice.MLP,
    Task.CLASSIFICATION: HeadChoice.MLP,
    Task.MULTILABEL: HeadChoice.MLP,
    Task.TOKEN_CLASSIFICATION: HeadChoice.CONV,
    Task.TOKEN_REGRESSION: HeadChoice.CONV,
}
"""``--head`` when none is given: the mean-pooled MLP for sequence tasks (bionemo-esm2's default head, which sees
every residue where Hugging Face's reads the ``<cls>`` vector only), the convolution for per-residue tasks (it sees
each residue's neighbours)."""

DEFAULT_LR: dict[EncoderMode, float] = {EncoderMode.FULL: 1e-4, EncoderMode.LORA: 5e-4, EncoderMode.FROZEN: 1e-3}
"""``--lr`` when none is given: smaller the more of the pretrained encoder trains."""

_LORA_OPTIONS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets")


@dataclass(frozen=True, kw_only=True, slots=True)
class FinetuneOptions:
    """What to fine-tune: the task, its label columns, the head, what of the encoder trains."""

    task: Task
    label_columns: tuple[str, ...]
    mask_column: str | None
    head: HeadConfig
    encoder: EncoderMode
    lora: LoRASettings | None
    class_weights: ClassWeighting = ClassWeighting.NONE
    best: BestMetric | None = None
    """The validation metric that picks the exported weights (``--best-metric``); None: the task's default."""

    @property
    def best_metric(self) -> BestMetric:
        """:attr:`best`, else the task's default (:data:`~bionemo.esm2.finetune.metric_names.BEST_METRIC`)."""
        return self.best or BEST_METRIC[self.task]


def finetune_options(settings: RunSettings) -> FinetuneOptions:
    """The fine-tuning options of ``settings``.

    Raises:
        OptionError: No or an unknown ``--task``, ``--encoder`` or ``--head``; label options that do not fit the
            task (:func:`~bionemo.esm2.finetune.tasks.check_label_options`); a head the task cannot use; LoRA options
            without ``--encoder lora``; invalid LoRA values; ``--class-weights balanced`` for a task without
            classes; a ``--best-metric`` the task does not log. ``option`` names the flag.
    """
    if settings.task is None:
        raise OptionError(f"fine-tuning needs --task; valid: {', '.join(t.value for t in Task)}", "--task")
    task = _choice(Task, settings.task, "--task")
    encoder = _choice(EncoderMode, settings.encoder, "--encoder")
    check_label_options(task, settings.label_column, settings.mask_column)
    choice = DEFAULT_HEAD[task] if settings.head is None else _choice(HeadChoice, settings.head, "--head")
    head = head_config(task, choice, **({} if settings.head_dropout is None else {"dropout": settings.head_dropout}))
    given = [name for name in _LORA_OPTIONS if getattr(settings, name) not in (None, [])]
    if given and encoder is not EncoderMode.LORA:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        verb, them = ("applies", "it") if len(given) == 1 else ("apply", "them")
        raise OptionError(
            f"{flags} {verb} to --encoder lora only (got --encoder {encoder}); add --encoder lora or leave {them} out",
            "--encoder",
        )
    lora = None
    if encoder is EncoderMode.LORA:
        defaults = LoRASettings()
        targets = tuple(t.strip().lower() for t in settings.lora_targets) or defaults.targets
        unknown = sorted(set(targets) - set(LORA_TARGETS))
        if unknown:
            raise OptionError(f"--lora-targets {unknown}: valid are {', '.join(LORA_TARGETS)}", "--lora-targets")
        try:
            lora = LoRASettings(
                rank=settings.lora_rank or defaults.rank,
                alpha=settings.lora_alpha or defaults.alpha,
                dropout=defaults.dropout if settings.lora_dropout is None else settings.lora_dropout,
                targets=targets,
            )
        except ValueError as error:
            raise OptionError(f"LoRA settings: {error}", "--lora-rank") from None
    weighting = (
        ClassWeighting.NONE
        if settings.class_weights is None
        else _choice(ClassWeighting, settings.class_weights, "--class-weights")
    )
    if weighting is not ClassWeighting.NONE and task not in WEIGHTED_TASKS:
        raise OptionError(
            f"--class-weights {weighting} weighs the classes of {WEIGHTED_TASK_NAMES}; "
            f"--task {task} has none: leave --class-weights out",
            "--class-weights",
        )
    try:
        best = None if settings.best_metric is None else best_metric(task, settings.best_metric)
    except ValueError as error:
        raise OptionError(str(error), "--best-metric") from None
    if best == BEST_METRIC[task]:
        best = None  # the default named: the same run as without the flag
    return FinetuneOptions(
        task=task,
        label_columns=tuple(settings.label_column),
        mask_column=settings.mask_column,
        head=head,
        encoder=encoder,
        lora=lora,
        class_weights=weighting,
        best=best,
    )


def _choice(kind: type[StrEnum], value: str, option: str) -> Any:
    try:
        return kind(str(value).strip().lower())
    except ValueError:
        raise OptionError(f"{option} {value!r}: valid are {', '.join(c.value for c in kind)}", option) from None
