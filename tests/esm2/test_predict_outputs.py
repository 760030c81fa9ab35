"""Complete prediction outputs: any layer, per residue, <cls>, output dtype; independent of row and batch."""

import torch
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.recipes.outputs import read_predictions, split_residues
from support.hf_esm import random_hf_esm, random_sequences

runner = CliRunner()


def predict(tmp_path, name: str, sequences: list[str], *args: str) -> tuple[list[str], dict[str, torch.Tensor]]:
    fasta = tmp_path / f"{name}.fasta"
    fasta.write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(sequences)))
    out = tmp_path / name
    result = runner.invoke(
        app,
        ["run", "predict", "--checkpoint", str(tmp_path / "hf"), "--data", str(fasta), "--output-dir", str(out), *args],
        terminal_width=300,
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    return read_predictions(out / "predictions.safetensors")


def test_layers_residues_and_cls_equal_transformers_hidden_states(tmp_path):
    from bionemo.esm2.tokenizer import ProteinTokenizer

    hf = random_hf_esm(tmp_path / "hf", hidden=64, heads=4, layers=3)
    sequences = random_sequences(5, seed=2)
    _, out = predict(
        tmp_path, "all", sequences, "--layer", "0", "--layer", "1", "--layer", "-1", "--include", "embeddings",
        "--include", "residue-embeddings", "--include", "cls", "--micro-batch-size", "2",
    )  # fmt: skip
    assert out["residue_offsets"].tolist() == torch.tensor([0, *map(len, sequences)]).cumsum(0).tolist()
    for key in ("residue_embeddings", "residue_embeddings.layer0", "residue_embeddings.layer1"):
        assert out[key].shape == (sum(map(len, sequences)), 64)
    tokenizer = ProteinTokenizer()
    for i, sequence in enumerate(sequences):
        with torch.no_grad():
            states = hf(input_ids=tokenizer.encode(sequence)[None], output_hidden_states=True).hidden_states
        for layer in (0, 1, 3):
            reference = states[layer][0, 1:-1]
            key = f"residue_embeddings.layer{layer}" if layer != 3 else "residue_embeddings"
            torch.testing.assert_close(split_residues(out, key)[i], reference, rtol=0, atol=1e-4)
            torch.testing.assert_close(out[f"embeddings.layer{layer}"][i], reference.mean(0), rtol=0, atol=1e-4)
        torch.testing.assert_close(out["cls"][i], states[3][0, 0], rtol=0, atol=1e-4)
    torch.testing.assert_close(out["embeddings.layer3"], out["embeddings"], rtol=0, atol=0)


def test_outputs_do_not_depend_on_row_batch_or_micro_batch_size(tmp_path):
    random_hf_esm(tmp_path / "hf")
    sequences = random_sequences(6, seed=5)
    sequences[4] = sequences[1]  # the same protein at two rows
    outputs = {
        mbs: predict(tmp_path, f"mbs{mbs}", sequences, "--micro-batch-size", mbs, "--include", "embeddings",
                     "--include", "perplexity", "--include", "logits")[1]
        for mbs in ("1", "4")
    }  # fmt: skip
    for key in ("embeddings", "perplexity", "logits"):
        torch.testing.assert_close(outputs["1"][key], outputs["4"][key], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(outputs["4"][key][4], outputs["4"][key][1], rtol=1e-6, atol=1e-6)


def test_output_dtype_and_bad_layers(tmp_path):
    random_hf_esm(tmp_path / "hf", layers=2)
    sequences = random_sequences(3, seed=6)
    _, out = predict(tmp_path, "bf16", sequences, "--output-dtype", "bfloat16", "--include", "residue-embeddings",
                     "--include", "perplexity")  # fmt: skip
    assert out["residue_embeddings"].dtype == torch.bfloat16
    assert out["perplexity"].dtype == torch.float32
    result = runner.invoke(
        app,
        ["run", "predict", "--checkpoint", str(tmp_path / "hf"), "--layer", "3", "--output-dir", str(tmp_path / "x")],
        terminal_width=300,
    )  # fmt: skip
    assert result.exit_code == 2
    text = result.output
    for border in "│╭╮╰╯─":
        text = text.replace(border, " ")
    assert "layers 0 (the embedding output) to 2" in " ".join(text.split())
    assert not (tmp_path / "x").exists()


def test_pseudo_perplexity_is_exact(tmp_path):
    """Each residue masked once, its true token's probability read: as computed here with transformers."""
    from bionemo.esm2.tokenizer import ProteinTokenizer

    hf = random_hf_esm(tmp_path / "hf", hidden=64, heads=4, layers=2)
    sequences = random_sequences(3, seed=8, low=6, high=20)
    _, out = predict(tmp_path, "pppl", sequences, "--include", "pseudo-perplexity", "--micro-batch-size", "2")
    tokenizer = ProteinTokenizer()
    expected = []
    for sequence in sequences:
        ids = tokenizer.encode(sequence)
        copies = ids.repeat(len(sequence), 1)
        positions = torch.arange(1, len(sequence) + 1)
        copies[torch.arange(len(sequence)), positions] = tokenizer.mask_id
        with torch.no_grad():
            log_probs = hf(input_ids=copies).logits.log_softmax(-1)
        picked = log_probs[torch.arange(len(sequence)), positions, ids[positions]]
        expected.append(torch.exp(-picked.mean()))
    torch.testing.assert_close(out["pseudo_perplexity"], torch.stack(expected), rtol=1e-5, atol=1e-5)
    assert out["pseudo_perplexity"].dtype == torch.float32
