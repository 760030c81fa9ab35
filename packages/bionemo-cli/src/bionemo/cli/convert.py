"""``bionemo convert from-hf`` and ``bionemo convert to-hf``: ESM-2 weights between Hugging Face and bionemo."""

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["convert_app"]

convert_app = typer.Typer(
    help="Convert ESM-2 weights between Hugging Face folders and bionemo files.", no_args_is_help=True
)

ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing output.")]


@convert_app.command("from-hf")
def from_hf(
    hf_dir: Annotated[
        Path, typer.Argument(help="Hugging Face ESM-2 folder (config.json + model.safetensors or pytorch_model.bin).")
    ],
    output: Annotated[Path, typer.Argument(help="The bionemo weights file to write (.safetensors).")],
    force: ForceOpt = False,
) -> None:
    """Convert a Hugging Face ESM-2 folder into a bionemo ``.safetensors`` file (usable as --checkpoint)."""
    from bionemo.esm2.checkpoint import CheckpointError, load_checkpoint
    from bionemo.esm2.hf import is_hf_folder

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
    from bionemo.esm2.weights import save_weights

    shape = tuple(loaded.model[k] for k in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size"))
    recipe = next(
        (
            name
            for name, known in ESM2_SHAPES.items()
            if (known.num_layers, known.hidden_size, known.num_attention_heads, known.ffn_hidden_size) == shape
        ),
        None,
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    save_weights(
        loaded.tensors,
        output,
        {
            "recipe": recipe,
            "model": loaded.model,
            "vocab_size": loaded.model["vocab_size"],
            "converted_from": str(hf_dir),
        },
    )
    _report(loaded.notes, f"wrote {output} ({sum(t.numel() for t in loaded.tensors.values()):,} parameters)")


@convert_app.command("to-hf")
def to_hf(
    checkpoint: Annotated[Path, typer.Argument(help="bionemo weights (.safetensors) or a Hugging Face folder.")],
    output_dir: Annotated[Path, typer.Argument(help="The Hugging Face folder to write.")],
    force: ForceOpt = False,
) -> None:
    """Write a Hugging Face ``EsmForMaskedLM`` folder (config, safetensors weights, tokenizer files)."""
    from bionemo.esm2.checkpoint import CheckpointError, load_checkpoint
    from bionemo.esm2.hf import bionemo_to_hf, write_hf_folder

    if output_dir.exists() and not output_dir.is_dir():
        raise typer.BadParameter(f"{output_dir} exists and is not a folder", param_hint="'OUTPUT_DIR'")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not force:
        raise typer.BadParameter(
            f"{output_dir} is not empty; pass --force to replace its contents", param_hint="'OUTPUT_DIR'"
        )
    try:
        loaded = load_checkpoint(checkpoint)
        folder = write_hf_folder(output_dir, bionemo_to_hf(loaded.tensors, loaded.model), loaded.model, force=force)
    except CheckpointError as error:
        raise typer.BadParameter(str(error), param_hint="'CHECKPOINT'") from None
    _report(loaded.notes, f"wrote {folder}: load it with transformers.EsmForMaskedLM.from_pretrained")


def _report(notes: list[str], done: str) -> None:
    for note in notes:
        typer.echo(f"note: {note}")
    typer.echo(done)
