"""Embeddings and other model outputs from Python: sequences in, tensors out, ``bionemo run predict`` underneath.

:func:`predict` is ``bionemo run predict --checkpoint CHECKPOINT`` on a list of sequences, in this process: the same
options as keywords, the same checks and errors (``SettingsError`` / ``InputError``, ``ValueError`` subclasses, with
``sequences[i]`` naming the item), the same batching and numerics; nothing is left on disk. Fine-tuned models predict
through :meth:`bionemo.esm2.finetune.api.FinetunedModel.predict`, which also decodes their labels.

Importing this module imports no torch.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bionemo.esm2.python_runs import SequenceInput, predicted, prediction_options
from bionemo.recipes.choices import Accelerator, Include, OutputDtype, Precision

if TYPE_CHECKING:
    import torch

__all__ = ["ModelOutputs", "predict"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelOutputs:
    """A model's outputs for ``n`` sequences, in input order (``bionemo run predict``'s ``predictions.safetensors``).

    Per-sequence tensors have ``n`` rows: ``embeddings`` ``[n, h]`` (the mean of the last layer over residues),
    ``embeddings.layer<k>`` (``layer``), ``cls`` ``[n, h]``, ``perplexity`` ``[n]``, ``pseudo_perplexity``
    ``[n]``, ``logits`` ``[n, s, 33]`` (position 0 ``<cls>``, 1..L the residues, L+1 ``<eos>``, zeros beyond).
    Per-residue tensors (``residue_embeddings``, ``residue_embeddings.layer<k>``) are flat over every sequence's
    residues: :meth:`residues` splits them; :meth:`contacts` the contact maps.
    """

    ids: list[str]
    """Sequence ids: the ``(id, sequence)`` pairs' ids, else ``row1``, ``row2``, ... (as a CSV without ``id``)."""
    tensors: dict[str, "torch.Tensor"]
    """Every tensor of ``predictions.safetensors``: what ``include`` asked for, plus the offsets of flat tensors."""

    def __getitem__(self, key: str) -> "torch.Tensor":
        """``tensors[key]``; a key that was not predicted says which were."""
        if key not in self.tensors:
            raise KeyError(f"{key!r} was not predicted; these were: {', '.join(sorted(self.tensors))} (see include=)")
        return self.tensors[key]

    @property
    def embeddings(self) -> "torch.Tensor":
        """``[n, h]``: each sequence's mean last-layer hidden state over its residues (``include`` ``embeddings``)."""
        return self["embeddings"]

    def residues(self, key: str = "residue_embeddings") -> list["torch.Tensor"]:
        """A flat per-residue tensor split per sequence: ``[L_i, h]`` views (``residue_embeddings``, its layers)."""
        from bionemo.recipes.outputs import split_residues

        self[key]  # a key not predicted: the KeyError names those that were
        return split_residues(self.tensors, key)

    def contacts(self) -> list["torch.Tensor"]:
        """Each sequence's ``[L_i, L_i]`` contact probabilities (``include`` ``contacts``)."""
        from bionemo.recipes.outputs import split_contacts

        self["contacts"]  # not predicted: the KeyError names what was
        return split_contacts(self.tensors)


def predict(
    checkpoint: str | Path,
    sequences: Sequence[SequenceInput],
    *,
    include: Sequence[Include | str] = (Include.EMBEDDINGS,),
    layer: Sequence[int] = (),
    output_dtype: OutputDtype | str = OutputDtype.FLOAT32,
    truncate: bool = False,
    micro_batch_size: int | None = None,
    tokens_per_batch: int | None = None,
    accelerator: Accelerator | str = Accelerator.AUTO,
    devices: int = 1,
    precision: Precision | str | None = None,
    verbose: bool = False,
) -> ModelOutputs:
    """Predict ``sequences`` with the ESM-2 at ``checkpoint``: ``bionemo run predict`` in this process.

    Every keyword is the CLI option of the same name with the CLI's default (but ``include``, whose default here
    is the embeddings alone); ``bionemo run predict --help`` says what each does.

    Args:
        checkpoint: A Hugging Face ESM-2 folder or a bionemo ``model.safetensors``
            (``bionemo.esm2.recipes.BUNDLED_CHECKPOINT`` is the bundled demo model).
        sequences: Protein sequences, or ``(id, sequence)`` pairs.
        include: What to predict: ``embeddings``, ``residue-embeddings``, ``cls``, ``logits``, ``perplexity``,
            ``pseudo-perplexity``, ``contacts``.
        layer: Extra layers' mean hidden states (0 = the embedding output, negatives count from the end).
        output_dtype: ``float32``, ``bfloat16`` or ``float16`` for embeddings and logits.
        truncate: Cut sequences longer than the model's context instead of refusing them.
        micro_batch_size: Sequences per batch; default: batches by tokens, as the CLI picks them.
        tokens_per_batch: Length-sorted batches of at most this many tokens.
        accelerator: ``auto``, ``cpu`` or ``gpu``.
        devices: Devices to predict on (more than one: run from a script, which Lightning starts once per device).
        precision: ``32``, ``bf16-mixed``, ...; default bf16 on GPUs, fp32 on the CPU.
        verbose: Let the libraries' warnings and log lines through (``--verbose``); by default the ones
            ``bionemo run`` hides are hidden during the call.

    Returns:
        The outputs, in input order.

    Raises:
        SettingsError: What ``bionemo run predict`` refuses: options, the checkpoint, sequences
            (``sequences[i]`` names them). A ``ValueError``.
        TypeError: ``sequences`` is a string or holds something other than strings and pairs.
    """
    from bionemo.esm2.recipes.prediction_shards import PREDICTIONS
    from bionemo.recipes.outputs import read_predictions

    options = prediction_options(
        Path(checkpoint),
        truncate=truncate,
        micro_batch_size=micro_batch_size,
        tokens_per_batch=tokens_per_batch,
        accelerator=accelerator,
        devices=devices,
        precision=precision,
    )
    options.update(include=[str(item) for item in include], layer=list(layer), output_dtype=str(output_dtype))
    with predicted(sequences, options, verbose=verbose) as out:
        ids, tensors = read_predictions(out / PREDICTIONS)
    return ModelOutputs(ids=ids, tensors=tensors)
