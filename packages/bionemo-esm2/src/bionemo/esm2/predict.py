"""``bionemo run predict`` for the ESM-2 recipes, with a Hugging Face folder or a bionemo file as ``--checkpoint``."""

import json
import shutil
from pathlib import Path
from typing import Any

from bionemo.esm2._common import checked_checkpoint, datamodule, model_config
from bionemo.recipes.settings import Include, Precision, RunSettings, SettingsError

__all__ = ["predict"]


def predict(settings: RunSettings, *, defaults: dict[str, Any], recipe: str) -> list[tuple[str, str]]:
    """Predict ``--data`` (default: the bundled demo sequences) with ``--checkpoint`` (default: bundled weights).

    Writes ``predictions.safetensors`` (rows in input order, sequence ids in the metadata): ``embeddings``
    ``[n, hidden]`` (mean over residues of the last layer after the final LayerNorm, from the unmasked
    sequence), with ``--include logits`` the raw ``logits [n, s, 33]`` of the unmasked sequence (``<cls>`` at
    position 0, zeros beyond ``<eos>``) and with ``--include perplexity`` the masked-token ``perplexity [n]``
    (15% of residues masked, the mask drawn from the sequence itself).
    """
    from bionemo.esm2.readers import InputError, read_sequences
    from bionemo.esm2.recipes import BUNDLED_CHECKPOINT, BUNDLED_SEQUENCES
    from bionemo.esm2.train import check_same_shape
    from bionemo.recipes.trainers import accelerator, check_hardware, check_output_dir

    if settings.model:
        raise SettingsError(
            "model settings apply to training; prediction reads the model from --checkpoint", "--config"
        )
    check_hardware(settings)
    checkpoint = checked_checkpoint(settings.checkpoint or BUNDLED_CHECKPOINT)
    if "recipe" in settings.model_fields_set:
        check_same_shape(checkpoint.model, defaults["model"], recipe, checkpoint.path)
    if settings.precision is None and accelerator(settings) == "gpu":
        settings = settings.model_copy(update={"precision": Precision.BF16})  # GPUs predict in bf16 by default
    data = settings.data or BUNDLED_SEQUENCES
    try:
        records = read_sequences(data, checkpoint.model["seq_length"] - 2, settings.truncate)
    except InputError as error:
        raise SettingsError(str(error), "--data") from None
    layers = absolute_layers(settings.layer, checkpoint.model["num_layers"])
    out = settings.output_dir or Path("bionemo_predictions")
    check_output_dir(out)
    return _predict(settings, defaults, recipe, checkpoint, records, out, layers)


def absolute_layers(layers: list[int], num_layers: int) -> list[int]:
    """``--layer`` values as absolute layer numbers (0..num_layers; -1 = num_layers), in the order given.

    Raises:
        SettingsError: A layer outside ``-(num_layers + 1)..num_layers``.
    """
    resolved = []
    for layer in layers:
        if not -(num_layers + 1) <= layer <= num_layers:
            raise SettingsError(
                f"--layer {layer}: this model has layers 0 (the embedding output) to {num_layers} (after the final "
                f"LayerNorm); negatives count from the end (-1 = {num_layers}, -{num_layers + 1} = 0)",
                "--layer",
            )
        resolved.append(layer if layer >= 0 else num_layers + 1 + layer)
    return list(dict.fromkeys(resolved))


def _predict(
    settings: RunSettings,
    defaults: dict[str, Any],
    recipe: str,
    checkpoint: Any,
    records: list,
    out: Path,
    layers: list[int],
) -> list[tuple[str, str]]:
    import functools

    import torch
    from lightning.pytorch.callbacks import RichProgressBar

    from bionemo.callbacks import PredictionWriter, merge_predictions
    from bionemo.esm2.data import PredictionDataset, data_step
    from bionemo.esm2.steps import make_predict_step
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.esm2.weights import apply_weights
    from bionemo.lightning import BionemoLightningModule, default_megatron_optimizer
    from bionemo.recipes.outputs import write_predictions
    from bionemo.recipes.trainers import build_trainer, is_launching_rank

    shards = out / "shards"
    if is_launching_rank() and shards.exists():
        shutil.rmtree(shards)  # a rerun replaces an interrupted one's partial shards
    include = set(settings.include)
    module = BionemoLightningModule(
        model_config(checkpoint.model, settings),
        forward_step=make_predict_step(
            embeddings=Include.EMBEDDINGS in include,
            logits=Include.LOGITS in include,
            perplexity=Include.PERPLEXITY in include,
            residues=Include.RESIDUE_EMBEDDINGS in include,
            cls=Include.CLS in include,
            pseudo_perplexity=Include.PSEUDO_PERPLEXITY in include,
            layers=layers,
            num_layers=checkpoint.model["num_layers"],
        ),
        data_step=data_step,
        optimizer=default_megatron_optimizer(),
        model_transform=functools.partial(apply_weights, tensors=checkpoint.tensors),
    )
    data = datamodule(
        settings,
        {**defaults, "model": checkpoint.model},
        predicting=True,
        predict=PredictionDataset(records, ProteinTokenizer()),
    )
    writer = PredictionWriter(shards, settings.write_interval.value, overwrite=True)
    trainer = build_trainer(settings, training=False, callbacks=[writer, RichProgressBar(leave=True)])
    trainer.predict(module, datamodule=data, return_predictions=False)
    trainer.strategy.barrier()  # every rank's shards are on disk before rank 0 merges them
    if trainer.global_rank != 0:
        return []
    merged = merge_predictions(shards)
    perplexity = None
    if Include.PERPLEXITY in include:
        perplexity = torch.exp(merged.pop("loss_sum") / merged.pop("num_masked").clamp(min=1))
        merged["perplexity"] = perplexity
    if Include.PSEUDO_PERPLEXITY in include:
        lengths = torch.tensor([len(r.sequence) for r in records], dtype=torch.float32)
        merged["pseudo_perplexity"] = torch.exp(merged.pop("pseudo_loss_sum") / lengths)
    merged = finish_outputs(merged, [len(r.sequence) for r in records], settings.output_dtype.value)
    path = write_predictions(
        out / "predictions.safetensors",
        merged,
        [r.id for r in records],
        {"recipe": recipe, "checkpoint": str(checkpoint.path)},
    )
    shutil.rmtree(shards, ignore_errors=True)
    metadata = checkpoint.metadata
    summary = {
        "sequences": len(records),
        "truncated_sequences": sum(r.truncated_from is not None for r in records),
        "mean_perplexity": None if perplexity is None else float(perplexity.mean()),
        "uniform_baseline_perplexity": 20.0,
        "checkpoint_validation_perplexity": metadata.get("val_ppl"),
        "untrained_validation_perplexity": metadata.get("untrained_val_ppl"),
        "predictions": str(path),
        "includes": sorted(i.value for i in include),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    truncated = sum(r.truncated_from is not None for r in records)
    rows = [("sequences", str(len(records)) + (f" ({truncated} cut by --truncate)" if truncated else ""))]
    if perplexity is not None:
        rows += [
            ("mean masked-token perplexity", f"{summary['mean_perplexity']:.3f}"),
            ("uniform guess over 20 amino acids", "20.000"),
        ]
    if "pseudo_perplexity" in merged:
        rows.append(
            ("mean pseudo-perplexity (each residue masked once)", f"{float(merged['pseudo_perplexity'].mean()):.3f}")
        )
    if checkpoint.source == "bionemo":
        rows.append(("validation perplexity at training: trained / untrained", _pair(metadata)))
    return [
        *rows,
        ("checkpoint", f"{checkpoint.path} ({checkpoint.source})"),
        *(("note", note) for note in checkpoint.notes),
        ("predictions (safetensors)", str(path)),
        ("contents", ", ".join(["sequence ids", "sample_index", *sorted(k for k in merged if k != "sample_index")])),
        ("summary", str(out / "summary.json")),
    ]


def finish_outputs(merged: dict[str, Any], lengths: list[int], dtype: str) -> dict[str, Any]:
    """Per-residue outputs flattened to ``[sum of lengths, h]`` with ``residue_offsets [n + 1]``; floats cast.

    Sequence ``i``'s residues are rows ``residue_offsets[i]:residue_offsets[i + 1]``. Embeddings, ``cls`` and
    logits are cast to ``dtype``; perplexities stay float32.
    """
    import torch

    finished: dict[str, Any] = {}
    keep = torch.zeros(len(lengths), max(lengths), dtype=torch.bool)
    for row, length in enumerate(lengths):
        keep[row, :length] = True
    for key, value in merged.items():
        if key.startswith("residue_embeddings"):
            value = value[:, : keep.shape[1]][keep[:, : value.shape[1]]]
            finished["residue_offsets"] = torch.tensor([0, *lengths]).cumsum(0)
        if value.is_floating_point() and not key.endswith("perplexity"):
            value = value.to(getattr(torch, dtype))
        finished[key] = value
    return finished


def _pair(metadata: dict[str, Any]) -> str:
    trained, untrained = metadata.get("val_ppl"), metadata.get("untrained_val_ppl")
    return " / ".join(f"{value:.3f}" if value else "not recorded" for value in (trained, untrained))
