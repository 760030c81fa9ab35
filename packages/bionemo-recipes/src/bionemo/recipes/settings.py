"""Run settings: recipe defaults, then a ``--config`` file, then command-line options, validated up front."""

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bionemo.recipes.choices import (
    Accelerator,
    Include,
    OutputDtype,
    Precision,
    SettingsError,
    StrategyChoice,
    WriteIntervalChoice,
)

__all__ = [
    "Accelerator",
    "Include",
    "OutputDtype",
    "Precision",
    "RunSettings",
    "SettingsError",
    "StrategyChoice",
    "WriteIntervalChoice",
    "load_config_file",
]


class RunSettings(BaseModel):
    """Every setting of ``bionemo run train`` / ``bionemo run predict``; ``None`` means the recipe's default."""

    model_config = ConfigDict(extra="forbid", use_enum_values=False)

    recipe: str = "esm2-demo"
    data: Path | None = None
    output_dir: Path | None = None
    checkpoint: Path | None = None
    devices: int = Field(1, ge=1)
    num_nodes: int = Field(1, ge=1)
    accelerator: Accelerator = Accelerator.AUTO
    strategy: StrategyChoice = StrategyChoice.AUTO
    tensor_parallel: int = Field(1, ge=1)
    pipeline_parallel: int = Field(1, ge=1)
    context_parallel: int = Field(1, ge=1)
    precision: Precision | None = None
    micro_batch_size: int | None = Field(None, ge=1)
    global_batch_size: int | None = Field(None, ge=1)
    truncate: bool = False
    # train
    max_steps: int | None = Field(None, ge=1)
    val_check_interval: int | None = Field(None, ge=1)
    lr: float | None = Field(None, gt=0)
    resume: bool = True
    seed: int = 0
    model: dict[str, Any] | None = None
    """Model hyper-parameters to change from the recipe's (training only; from a ``--config`` file)."""
    # finetune (``bionemo run finetune``; values checked by the recipe, e.g. ``bionemo.esm2.finetune``)
    val_data: Path | None = None
    """Labelled validation sequences; without them a seeded split of ``data`` (``val_fraction``)."""
    val_fraction: float = Field(0.1, gt=0, lt=1)
    """Share of ``data`` held out for validation when no ``val_data`` is given."""
    task: str | None = None
    """What the labels are: regression, classification, multilabel, token-classification, token-regression."""
    label_column: list[str] = Field(default_factory=list)
    """The label column(s) of the CSV files."""
    mask_column: str | None = None
    """Per-residue 0/1 column: 0 = not scored (token tasks)."""
    head: str | None = None
    """The prediction head (hf, mlp, conv); None: the task's default."""
    head_dropout: float | None = Field(None, ge=0, lt=1)
    """Dropout in the head (default: the head's own, 0.1 for hf, 0.25 for mlp and conv)."""
    encoder: str = "full"
    """What trains of the encoder: full, frozen (head only, on cached embeddings) or lora."""
    lora_rank: int | None = Field(None, ge=1)
    lora_alpha: float | None = Field(None, gt=0)
    lora_dropout: float | None = Field(None, ge=0, lt=1)
    lora_targets: list[str] = Field(default_factory=list)
    head_lr: float | None = Field(None, gt=0)
    """The head's learning rate (default: ``lr``)."""
    warmup_steps: int | None = Field(None, ge=0)
    """Steps of linear warm-up before the cosine decay (default: 10% of ``max_steps``)."""
    class_weights: str | None = None
    """Loss weights per class (classification tasks): ``none`` or ``balanced`` (default: none)."""
    best_metric: str | None = None
    """The validation metric that picks the exported weights and stops early (default: the task's)."""
    patience: int | None = Field(None, ge=1)
    """Stop after this many validations without a better validation metric (default: never stop early)."""
    global_batch_tokens: int | None = Field(None, ge=1)
    """Training and fine-tuning batches cut by tokens: at most this many (residues + 2 per sequence, no padding) per
    optimizer step over all devices; instead of ``global_batch_size``. Fine-tuning takes no ``micro_batch_size``
    with it (one micro-batch per device and step); pretraining splits each device's share into micro-batches of up to
    ``micro_batch_size`` x the model's ``seq_length`` tokens."""
    # predict
    include: list[Include] = Field(default_factory=lambda: [Include.EMBEDDINGS, Include.PERPLEXITY])
    write_interval: WriteIntervalChoice = WriteIntervalChoice.BATCH
    tokens_per_batch: int | None = Field(None, ge=1)
    """Prediction batches of length-sorted sequences holding at most this many tokens, padding included."""
    layer: list[int] = Field(default_factory=list)
    """Extra layers to output (0 = embedding output, num_layers = after the final LayerNorm, negatives from the end)."""
    output_dtype: OutputDtype = OutputDtype.FLOAT32
    overwrite: bool = False
    """Replace another run's predictions in ``output_dir`` (without it such a folder is refused)."""
    unpadded: bool | None = None
    """Predict on the sequences concatenated without padding (variable-length flash attention: GPUs, bf16/fp16);
    ``None``: wherever the run can (one model replica per GPU, CUDA, bf16/fp16, a torch with varlen attention)."""

    def model_parallel_size(self) -> int:
        """Tensor x pipeline x context parallel ranks per model replica."""
        return self.tensor_parallel * self.pipeline_parallel * self.context_parallel

    def data_parallel_size(self) -> int:
        """Model replicas over all devices of all nodes."""
        return self.devices * self.num_nodes // self.model_parallel_size()

    @classmethod
    def resolve(cls, file: Path | None, overrides: dict[str, Any]) -> "RunSettings":
        """Settings from ``file`` (YAML or JSON) with ``overrides`` (options given on the command line) on top.

        Raises:
            SettingsError: Unreadable file, unknown keys, or invalid values (naming the key and what is valid).
        """
        values = load_config_file(file) if file is not None else {}
        values.update({key: value for key, value in overrides.items() if value is not None})
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            problem = error.errors()[0]
            key = ".".join(str(part) for part in problem["loc"])
            if problem["type"] == "extra_forbidden":
                raise SettingsError(_unknown_setting(key, file), "--config") from None
            raise SettingsError(
                f"setting {key!r}: {problem['msg']} (got {problem.get('input')!r})"
                + (f" in {file}" if file is not None and key not in overrides else ""),
                "--" + key.split(".")[0].replace("_", "-"),
            ) from None


def _unknown_setting(key: str, file: Path | None) -> str:
    """The message for a setting ``RunSettings`` does not have: the closest names, then every valid one."""
    import difflib

    valid = sorted(RunSettings.model_fields)
    close = difflib.get_close_matches(key, valid, n=2)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    where = f" in {file}" if file is not None else ""
    return f"unknown setting {key!r}{where}{hint}; valid settings: {', '.join(valid)}"


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or JSON (``.json``) mapping of settings."""
    if not path.is_file():
        raise SettingsError(f"config file {path} does not exist", "--config")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".json":
            values = json.loads(text)
        elif path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(text)
        else:
            raise SettingsError(f"config file {path} must end in .yaml, .yml or .json", "--config")
    except (json.JSONDecodeError, ImportError) as error:
        raise SettingsError(f"config file {path} is not valid: {error}", "--config") from None
    except Exception as error:  # yaml.YAMLError and friends
        if isinstance(error, SettingsError):
            raise
        raise SettingsError(f"config file {path} is not valid YAML: {error}", "--config") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise SettingsError(
            f"config file {path} must hold a mapping of settings, not {type(values).__name__}", "--config"
        )
    return {str(key).replace("-", "_"): value for key, value in values.items()}
