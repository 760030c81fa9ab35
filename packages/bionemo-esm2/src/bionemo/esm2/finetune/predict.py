"""``bionemo run predict`` with a fine-tuned model: the head's outputs, decoded to ``predictions.csv``.

The run is ``bionemo.esm2.recipes.predict``'s (batching, shards, resume, layouts); a fine-tuned ``--checkpoint``
(a bionemo file with :data:`~bionemo.esm2.finetune.spec.FINETUNE_KEY`, or a Hugging Face ``EsmFor*Classification``
folder) changes the model, the step and the files written:

- ``predictions.safetensors``: ``probabilities [n, classes]`` (classification; multilabel ``[n, labels]``, each
  label's own probability) or ``values [n, k]`` (regression); token tasks per residue, flat with
  ``residue_offsets`` as the residue embeddings are: ``probabilities [residues, classes]`` or ``values
  [residues]``. The metadata key :data:`LABELS_KEY` holds the columns' names (classes, labels or regression
  columns) as a JSON list. ``--include embeddings / residue-embeddings / cls`` add the encoder's outputs as usual.
- ``predictions.csv``: ``id`` then one column per label column as named at fine-tuning
  (:func:`bionemo.esm2.finetune.objectives.csv_cells`), rows in input order.
"""

import csv
from pathlib import Path
from typing import Any

from bionemo.esm2.finetune.spec import FinetuneSpec
from bionemo.esm2.finetune.tasks import Task
from bionemo.recipes.choices import Include
from bionemo.recipes.settings import RunSettings, SettingsError

__all__ = [
    "FINETUNED_INCLUDES",
    "LABELS_KEY",
    "PREDICTIONS_CSV",
    "finetuned_includes",
    "finetuned_transform",
    "make_finetuned_predict_step",
    "output_key",
    "write_predictions_csv",
]

LABELS_KEY = "labels"
"""Metadata key of ``predictions.safetensors``: the output columns' names (JSON list), in the tensors' order."""

PREDICTIONS_CSV = "predictions.csv"

FINETUNED_INCLUDES = frozenset({Include.EMBEDDINGS, Include.RESIDUE_EMBEDDINGS, Include.CLS})
"""What a fine-tuned model predicts besides its head's outputs: it has no language-model head (no logits,
perplexities) and no contact head."""


def output_key(task: Task) -> str:
    """``probabilities`` for the categorical and multilabel tasks, ``values`` for the regressions."""
    return "probabilities" if task.categorical or task is Task.MULTILABEL else "values"


def finetuned_includes(settings: RunSettings, spec: FinetuneSpec) -> list[Include]:
    """The ``--include`` outputs of a fine-tuned model's prediction (its default: none beyond the head's).

    Raises:
        SettingsError: ``--include`` outputs a fine-tuned model cannot give (:data:`FINETUNED_INCLUDES`).
    """
    if "include" not in settings.model_fields_set:
        return []
    refused = [i.value for i in settings.include if i not in FINETUNED_INCLUDES]
    if refused:
        valid = ", ".join(sorted(i.value for i in FINETUNED_INCLUDES))
        raise SettingsError(
            f"--include {', '.join(refused)}: a fine-tuned model ({spec.task}) has no language-model or contact "
            f"head; it predicts its task's outputs and, with --include, {valid}",
            "--include",
        )
    return list(settings.include)


def finetuned_transform(model: Any, *, spec: FinetuneSpec, tensors: dict[str, Any], dtype: Any) -> Any:
    """Load a fine-tuned file's tensors (adapters included), fold LoRA into the weights, cast to ``dtype``."""
    from bionemo.esm2.finetune.module import prepare_model
    from bionemo.layers import merge_lora

    prepare_model(model, spec=spec, tensors=tensors, with_head=True)
    merge_lora(model)  # the same outputs, without the adapters' extra matmuls
    return model.to(dtype)


def make_finetuned_predict_step(
    spec: FinetuneSpec, *, embeddings: bool, residues: bool, cls: bool, output_dtype: Any, unpadded: bool
):
    """The predict step of a fine-tuned model over ``PredictionDataset`` batches.

    Outputs for ``b`` sequences: :func:`output_key` ``[b, k]`` (sequence tasks) or ``[b, s - 2, k]`` /
    ``[b, s - 2]`` (token tasks: residues only, zeros beyond each sequence), float32, from
    :func:`bionemo.esm2.finetune.objectives.predictions`; and, if asked, ``embeddings [b, h]`` (mean over
    residues), ``residue_embeddings [b, s - 2, h]``, ``cls [b, h]`` of the encoder's last hidden states in
    ``output_dtype``. One forward pass per batch (``unpadded``: on the concatenated real tokens).
    """
    import torch

    from bionemo.esm2.finetune.data import residue_mask
    from bionemo.esm2.finetune.objectives import predictions
    from bionemo.esm2.model.packing import unpad

    key = output_key(spec.task)

    def predict_step(model: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        tokens, real = batch["tokens"], batch["attention_mask"]
        mask = residue_mask(real)
        if unpadded:
            ids, sequences, index = unpad(tokens, batch["host_lengths"])
            logits, hidden = model(ids, None, residue_mask=mask, unpadded=sequences, index=index, output_hidden=True)
        else:
            logits, hidden = model(tokens, batch.get("padding"), residue_mask=mask, output_hidden=True)
        values = predictions(spec.task, logits)
        out: dict[str, torch.Tensor] = {}
        if spec.task.per_residue:
            weights = mask.to(values.dtype).view(*mask.shape, *([1] * (values.dim() - 2)))
            out[key] = (values * weights)[:, 1:-1].contiguous()
        else:
            out[key] = values
        if embeddings or residues or cls:
            states = hidden.transpose(0, 1).float() * mask.unsqueeze(-1)  # [b, s, h], zero outside residues
            if embeddings:
                mean = states.sum(dim=1) / mask.sum(dim=1, keepdim=True).clamp(min=1)
                out["embeddings"] = mean.to(output_dtype)
            if residues:
                out["residue_embeddings"] = states[:, 1:-1].to(output_dtype)
            if cls:
                out["cls"] = hidden[0].to(output_dtype)
        return out

    return predict_step


def write_predictions_csv(path: Path, predictions_file: Path, spec: FinetuneSpec) -> Path:
    """Decode ``predictions.safetensors`` into ``predictions.csv`` (input order), written atomically."""
    from bionemo.core.atomic_files import replaced_atomically
    from bionemo.esm2.finetune.objectives import csv_cells
    from bionemo.recipes.outputs import read_predictions, split_residues

    ids, tensors = read_predictions(predictions_file)
    key = output_key(spec.task)
    rows: Any = split_residues(tensors, key) if spec.task.per_residue else tensors[key]
    with replaced_atomically(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", *spec.labels.columns])
        for sequence_id, row in zip(ids, rows, strict=True):
            writer.writerow([sequence_id, *csv_cells(spec.task, row, spec.labels)])
    return path
