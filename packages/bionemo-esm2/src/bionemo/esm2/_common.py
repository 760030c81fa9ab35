"""What ``train`` and ``predict`` share: the model config, the datamodule and checkpoint checks."""

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bionemo.recipes.registry import RecipeDefaults
from bionemo.recipes.settings import Precision, RunSettings, SettingsError

__all__ = ["checked_checkpoint", "checked_checkpoint_header", "datamodule", "model_config"]


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

    from bionemo.esm2.model import ESM2Config
    from bionemo.recipes.trainers import accelerator, uses_megatron

    bf16 = settings.precision == Precision.BF16 and (uses_megatron(settings, training=training) or not training)
    fp16 = settings.precision == Precision.FP16 and not training
    params_dtype = torch.bfloat16 if bf16 else torch.float16 if fp16 else torch.float32
    return (config_class or ESM2Config)(
        tensor_model_parallel_size=settings.tensor_parallel,
        pipeline_model_parallel_size=settings.pipeline_parallel,
        context_parallel_size=settings.context_parallel,
        use_cpu_initialization=accelerator(settings) == "cpu",  # --accelerator cpu on a GPU machine: the CPU
        bf16=bf16,
        fp16=fp16,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,  # what the stages send each other (megatron requires it for PP > 1)
        # batches are padded to their longest sequence: stages tell each other the shape of what they send
        variable_seq_lengths=settings.pipeline_parallel > 1,
        moe_token_dispatcher_type="alltoall",  # no experts; megatron refuses variable lengths with "allgather"
        perform_initialization=training,
        **model,
        **extra,
    )


def datamodule(
    settings: RunSettings,
    defaults: RecipeDefaults,
    predicting: bool = False,
    *,
    loader: dict[str, Any] | None = None,
    **datasets: Any,
):
    """The recipe's MegatronDataModule; ``loader`` passes DataLoader options (``num_workers``, ``pin_memory``)."""
    from bionemo.esm2.data import collate_proteins
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning import MegatronDataModule

    micro = defaults.value(settings, "micro_batch_size")
    global_batch = settings.global_batch_size or (
        micro * settings.data_parallel_size()
        if predicting
        else max(defaults.global_batch_size, micro * settings.data_parallel_size())
    )
    return MegatronDataModule(
        micro_batch_size=micro,
        global_batch_size=global_batch,
        seq_length=defaults.model["seq_length"],
        collate_fn=functools.partial(collate_proteins, pad_id=ProteinTokenizer().pad_id),
        **(loader or {}),
        **datasets,
    )


def checked_checkpoint_header(path: Path):
    """:func:`bionemo.esm2.checkpoints.header.read_checkpoint_header` (no torch) with ``--checkpoint`` errors."""
    from bionemo.esm2.checkpoints.header import read_checkpoint_header
    from bionemo.esm2.hf.layout import CheckpointError

    try:
        return read_checkpoint_header(path)
    except CheckpointError as error:
        raise SettingsError(str(error), "--checkpoint") from None


def checked_checkpoint(path: Path):
    """:func:`bionemo.esm2.checkpoints.load.load_checkpoint` with its errors as ``--checkpoint`` settings errors."""
    from bionemo.esm2.checkpoints.load import load_checkpoint
    from bionemo.esm2.hf.layout import CheckpointError

    try:
        return load_checkpoint(path)
    except CheckpointError as error:
        raise SettingsError(str(error), "--checkpoint") from None
