"""A recipe's ``model:`` settings: their names, their checks, and the ``ESM2Config`` a run builds of them.

Standard library and ``bionemo.recipes`` only at import, so ``--config`` and ``--checkpoint`` shapes are checked
before megatron-core is imported; ``ESM2Config`` is imported only for keys beyond :data:`MODEL_KEYS` and to build
a run's config.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

from bionemo.recipes.settings import Precision, RunSettings, SettingsError

__all__ = [
    "MODEL_KEYS",
    "SHAPE_KEYS",
    "ESM2ModelSettings",
    "check_same_shape",
    "checked_model_settings",
    "model_config",
]


class ESM2ModelSettings(TypedDict, total=False):
    """A recipe's ``model:`` settings: the ``ESM2Config`` fields known valid without importing it (megatron-core).

    ``--config`` may also set any other ``ESM2Config`` (megatron ``TransformerConfig``) field; those are checked
    against ``ESM2Config`` itself when a run starts.
    """

    vocab_size: int
    seq_length: int
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    layernorm_epsilon: float
    hidden_dropout: float
    attention_dropout: float
    token_dropout: bool
    mask_token_id: int
    rotary_base: float
    masked_softmax_fusion: bool
    bias_activation_fusion: bool
    bias_dropout_fusion: bool
    gradient_accumulation_fusion: bool
    apply_rope_fusion: bool
    use_cpu_initialization: bool


MODEL_KEYS: frozenset[str] = ESM2ModelSettings.__required_keys__ | ESM2ModelSettings.__optional_keys__
"""The names of :class:`ESM2ModelSettings`."""


SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size")
"""The model settings that make a checkpoint's shape."""


def check_same_shape(found: Mapping[str, Any], wanted: Mapping[str, Any], recipe: str, checkpoint: Path) -> None:
    """Refuse a checkpoint of another shape than the recipe's (``train --checkpoint``, ``predict --recipe``)."""
    differ = [key for key in SHAPE_KEYS if found.get(key) != wanted.get(key)]
    if not differ:
        return
    from bionemo.esm2.catalog import ESM2_SHAPES

    same = [name for name, shape in ESM2_SHAPES.items() if all(getattr(shape, k) == found.get(k) for k in SHAPE_KEYS)]
    hint = f"; use --recipe {same[0]}" if same else "; set the recipe's shape under model: in --config"
    raise SettingsError(
        f"checkpoint {checkpoint} has "
        + ", ".join(f"{k}={found.get(k)}" for k in differ)
        + f" but recipe {recipe} has "
        + ", ".join(f"{k}={wanted.get(k)}" for k in differ)
        + hint,
        "--checkpoint",
    )


def checked_model_settings(model: dict[str, Any]) -> dict[str, Any]:
    """``model`` if every key is an ``ESM2Config`` field, else a SettingsError listing the valid ones.

    ``ESM2Config`` (megatron-core) is imported only for keys outside :data:`MODEL_KEYS`.
    """
    if MODEL_KEYS.issuperset(model):
        return model
    import dataclasses

    from bionemo.esm2.model.esm2 import ESM2Config

    valid = {field.name for field in dataclasses.fields(ESM2Config)}
    unknown = sorted(set(model) - valid)
    if unknown:
        raise SettingsError(
            f"unknown model settings {unknown}; valid ones include num_layers, hidden_size, num_attention_heads, "
            "ffn_hidden_size, seq_length, token_dropout (any megatron TransformerConfig field)",
            "--config",
        )
    return model


def model_config(
    model: Mapping[str, Any], settings: RunSettings, *, training: bool = True, config_class: Any = None, **extra: Any
):
    """The ``ESM2Config`` of ``model`` settings under this run's parallel layout and precision.

    ``config_class`` (a subclass of ``ESM2Config``, default ``ESM2Config``) is built instead, with its ``extra``
    fields.

    Training: parameters are bf16 under MegatronStrategy with bf16 precision; Lightning's strategies keep fp32
    parameters and autocast. Prediction: parameters are in the precision's type (bf16, fp16) on every strategy
    and are not randomly initialized (the checkpoint's weights replace them). Pipeline stages exchange
    activations in the parameters' type, of each micro-batch's own sequence length.
    """
    import torch

    from bionemo.esm2.model.esm2 import ESM2Config
    from bionemo.recipes.trainers import accelerator, uses_megatron

    precision = settings.precision or Precision.FP32
    half_parameters = not training or (precision == Precision.BF16 and uses_megatron(settings, training=training))
    params_dtype = precision.torch_dtype() if half_parameters else torch.float32
    return (config_class or ESM2Config)(
        tensor_model_parallel_size=settings.tensor_parallel,
        pipeline_model_parallel_size=settings.pipeline_parallel,
        context_parallel_size=settings.context_parallel,
        use_cpu_initialization=accelerator(settings) == "cpu",  # --accelerator cpu on a GPU machine: the CPU
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,  # what the stages send each other (megatron requires it for PP > 1)
        # batches are padded to their longest sequence: stages tell each other the shape of what they send
        variable_seq_lengths=settings.pipeline_parallel > 1,
        moe_token_dispatcher_type="alltoall",  # no experts; megatron refuses variable lengths with "allgather"
        perform_initialization=training,
        **model,
        **extra,
    )
