"""``bionemo convert from-hf`` and ``bionemo convert to-hf``: ESM-2 weights between Hugging Face and bionemo.

Fine-tuned models convert too: an ``EsmFor{Sequence,Token}Classification`` folder into a fine-tuned bionemo file,
and a fine-tuned file with an ``hf`` head into such a folder (LoRA merged), or with ``--peft`` into a PEFT adapter.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from bionemo.esm2.finetune.spec import FinetuneSpec

__all__ = ["convert_app"]

convert_app = typer.Typer(
    help="Convert ESM-2 weights between Hugging Face folders and bionemo files.", no_args_is_help=True
)

ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing output.")]


@convert_app.command("from-hf")
def from_hf(
    hf_dir: Annotated[
        Path,
        typer.Argument(
            help="Hugging Face ESM-2 folder (config.json + model.safetensors or pytorch_model.bin): EsmForMaskedLM, "
            "or EsmForSequenceClassification / EsmForTokenClassification (a fine-tuned model)."
        ),
    ],
    output: Annotated[Path, typer.Argument(help="The bionemo weights file to write (.safetensors).")],
    force: ForceOpt = False,
) -> None:
    """Convert a Hugging Face ESM-2 folder into a bionemo ``.safetensors`` file (usable as --checkpoint).

    A classification folder becomes a fine-tuned model file: its head and labels (config.json's id2label,
    problem_type) are kept in it.
    """
    from bionemo.esm2.checkpoints.load import load_checkpoint
    from bionemo.esm2.hf.layout import CheckpointError, is_hf_folder

    if not is_hf_folder(hf_dir):
        raise typer.BadParameter(f"{hf_dir} is not a folder; give a Hugging Face ESM-2 folder", param_hint="'HF_DIR'")
    if output.suffix != ".safetensors":
        raise typer.BadParameter(f"{output} must end in .safetensors", param_hint="'OUTPUT'")
    if output.exists() and not force:
        raise typer.BadParameter(f"{output} exists; pass --force to replace it", param_hint="'OUTPUT'")
    try:
        loaded = load_checkpoint(hf_dir)
    except CheckpointError as error:
        raise typer.BadParameter(str(error), param_hint="'HF_DIR'") from None
    from bionemo.esm2.catalog import ESM2_SHAPES
    from bionemo.esm2.checkpoints.weights import save_weights

    shape = tuple(loaded.model[k] for k in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size"))
    recipe = next(
        (
            name
            for name, known in ESM2_SHAPES.items()
            if (known.num_layers, known.hidden_size, known.num_attention_heads, known.ffn_hidden_size) == shape
        ),
        None,
    )
    metadata = {
        "recipe": recipe,
        "model": loaded.model,
        "vocab_size": loaded.model["vocab_size"],
        "converted_from": str(hf_dir),
    }
    if loaded.finetune is not None:
        from bionemo.esm2.finetune.spec import FINETUNE_KEY

        metadata[FINETUNE_KEY] = loaded.finetune.to_json()
    output.parent.mkdir(parents=True, exist_ok=True)
    save_weights(loaded.tensors, output, metadata)
    _report(loaded.notes, f"wrote {output} ({sum(t.numel() for t in loaded.tensors.values()):,} parameters)")


@convert_app.command("to-hf")
def to_hf(
    checkpoint: Annotated[Path, typer.Argument(help="bionemo weights (.safetensors) or a Hugging Face folder.")],
    output_dir: Annotated[Path, typer.Argument(help="The Hugging Face folder to write.")],
    force: ForceOpt = False,
    peft: Annotated[
        bool,
        typer.Option(
            "--peft",
            help="For a model fine-tuned with --encoder lora: write its adapter and head as a PEFT adapter "
            "(adapter_config.json, adapter_model.safetensors) for the pretrained model it started from, "
            "instead of the whole model with LoRA merged.",
        ),
    ] = False,
) -> None:
    """Write a Hugging Face folder: ``EsmForMaskedLM``, or the fine-tuned model's classification model or adapter.

    Pretrained weights become an ``EsmForMaskedLM``; a fine-tuned model with an ``hf`` head an
    ``EsmForSequenceClassification`` / ``EsmForTokenClassification`` (LoRA merged into the weights), or with
    ``--peft`` a PEFT adapter. Each folder holds config (or adapter config), safetensors weights and, for whole
    models, tokenizer files.
    """
    from bionemo.esm2.checkpoints.header import read_checkpoint_header
    from bionemo.esm2.hf.layout import CheckpointError

    if output_dir.exists() and not output_dir.is_dir():
        raise typer.BadParameter(f"{output_dir} exists and is not a folder", param_hint="'OUTPUT_DIR'")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not force:
        raise typer.BadParameter(
            f"{output_dir} is not empty; pass --force to replace its contents", param_hint="'OUTPUT_DIR'"
        )
    try:
        header = read_checkpoint_header(checkpoint)
    except CheckpointError as error:
        raise typer.BadParameter(str(error), param_hint="'CHECKPOINT'") from None
    _check_exportable(checkpoint, header.finetune, peft)

    from bionemo.esm2.checkpoints.load import load_checkpoint
    from bionemo.esm2.finetune.hf_tensors import finetuned_to_hf, write_peft_adapter
    from bionemo.esm2.hf.files import bionemo_to_hf, write_hf_folder

    try:
        loaded = load_checkpoint(checkpoint)
        spec = loaded.finetune
        if spec is None:
            folder = write_hf_folder(output_dir, bionemo_to_hf(loaded.tensors, loaded.model), loaded.model, force=force)
            done = f"wrote {folder}: load it with transformers.EsmForMaskedLM.from_pretrained"
        elif peft:
            folder = write_peft_adapter(output_dir, loaded.tensors, loaded.model, spec, force=force)
            architecture = _architecture(spec)
            done = (
                f"wrote the PEFT adapter {folder}: load it with peft.PeftModel.from_pretrained("
                f"transformers.{architecture}.from_pretrained(BASE, num_labels={spec.num_outputs}), {str(folder)!r}), "
                "BASE being the pretrained Hugging Face folder the model was fine-tuned from"
            )
        else:
            tensors, config = finetuned_to_hf(loaded.tensors, loaded.model, spec)
            folder = write_hf_folder(output_dir, tensors, loaded.model, force=force, config=config)
            merged = " (LoRA merged into the weights)" if spec.lora is not None else ""
            done = f"wrote {folder}{merged}: load it with transformers.{_architecture(spec)}.from_pretrained"
    except CheckpointError as error:
        raise typer.BadParameter(str(error), param_hint="'CHECKPOINT'") from None
    _report(loaded.notes, done)


def _architecture(spec: "FinetuneSpec") -> str:
    from bionemo.esm2.finetune.hf_heads import HF_ARCHITECTURES

    return HF_ARCHITECTURES[spec.head.kind]


def _check_exportable(checkpoint: Path, spec: "FinetuneSpec | None", peft: bool) -> None:
    """Refuse, before any tensor is read, what Hugging Face cannot hold: other heads; ``--peft`` without LoRA."""
    from bionemo.esm2.finetune.head_config import HEADS_EXPORTABLE_TO_HF
    from bionemo.esm2.finetune.hf_heads import HF_ARCHITECTURES

    if spec is not None and spec.head.kind not in HEADS_EXPORTABLE_TO_HF:
        valid = ", ".join(f"{kind} ({HF_ARCHITECTURES[kind]})" for kind in sorted(HEADS_EXPORTABLE_TO_HF))
        raise typer.BadParameter(
            f"{checkpoint} has a {spec.head.kind} head, which transformers has no model for; heads that export "
            f"to Hugging Face: {valid} (fine-tune with --head hf)",
            param_hint="'CHECKPOINT'",
        )
    if peft and spec is None:
        raise typer.BadParameter(
            f"{checkpoint} holds pretrained weights; --peft writes the LoRA adapter of a model fine-tuned with "
            "--encoder lora (leave out --peft for an EsmForMaskedLM folder)",
            param_hint="'--peft'",
        )
    if peft and spec is not None and spec.lora is None:
        raise typer.BadParameter(
            f"{checkpoint} was fine-tuned with --encoder {spec.encoder}; --peft needs --encoder lora (it writes the "
            "LoRA adapter): leave out --peft to write the whole model",
            param_hint="'--peft'",
        )


def _report(notes: list[str], done: str) -> None:
    for note in notes:
        typer.echo(f"note: {note}")
    typer.echo(done)
