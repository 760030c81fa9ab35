"""Hugging Face ESM-2 folders through the CLI: predict, convert both ways, train from them, refuse bad ones."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.recipes.outputs import read_predictions
from support.hf_esm import edit_weights, hf_outputs, mutate_config, random_hf_esm, random_sequences

runner = CliRunner()


def flat(output: str) -> str:
    for border in "│╭╮╰╯─":
        output = output.replace(border, " ")
    return " ".join(output.split())


def invoke(*args: str):
    result = runner.invoke(app, list(args), terminal_width=400)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


def write_fasta(path: Path, sequences: list[str]) -> Path:
    path.write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(sequences)))
    return path


@pytest.mark.parametrize(("hidden", "heads", "token_dropout"), [(64, 4, True), (48, 6, False)])
def test_predict_with_a_hugging_face_folder_gives_its_embeddings_and_logits(tmp_path, hidden, heads, token_dropout):
    hf = random_hf_esm(tmp_path / "hf", hidden=hidden, heads=heads, layers=2, token_dropout=token_dropout)
    sequences = random_sequences(7, seed=hidden)
    out = tmp_path / "pred"
    invoke(
        "run", "predict", "--checkpoint", str(tmp_path / "hf"),
        "--data", str(write_fasta(tmp_path / "x.fasta", sequences)),
        "--include", "embeddings", "--include", "logits", "--micro-batch-size", "3", "--output-dir", str(out),
        "--accelerator", "cpu",
    )  # fmt: skip
    ids, tensors = read_predictions(out / "predictions.safetensors")
    assert ids == [f"s{i}" for i in range(7)]
    ref_logits, ref_embeddings = hf_outputs(hf, sequences)
    assert tensors["embeddings"].dtype == torch.float32
    torch.testing.assert_close(tensors["embeddings"], ref_embeddings, rtol=0, atol=1e-4)
    logits = tensors["logits"]
    assert logits.dtype == torch.float32
    assert logits.shape == (7, max(len(s) for s in sequences) + 2, 33)
    for i, reference in enumerate(ref_logits):
        torch.testing.assert_close(logits[i, : len(reference)], reference, rtol=0, atol=1e-4)
        assert logits[i, len(reference) :].eq(0).all()


def test_round_trip_from_hf_to_hf_loads_in_transformers_with_the_same_logits(tmp_path):
    from transformers import EsmForMaskedLM, EsmTokenizer

    hf = random_hf_esm(tmp_path / "hf", hidden=64, heads=4, layers=2, token_dropout=False)
    converted = tmp_path / "esm.safetensors"
    result = invoke("convert", "from-hf", str(tmp_path / "hf"), str(converted))
    assert "contact_head" not in flat(result.output)  # converted (tests/esm2/test_contacts.py), not ignored
    invoke("convert", "to-hf", str(converted), str(tmp_path / "back"))
    again = EsmForMaskedLM.from_pretrained(tmp_path / "back").eval()
    sequences = random_sequences(4, seed=1)
    for mine, theirs in zip(hf_outputs(again, sequences)[0], hf_outputs(hf, sequences)[0], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)
    tokenizer = EsmTokenizer.from_pretrained(tmp_path / "back")
    from bionemo.esm2.tokenizer import ProteinTokenizer

    assert tokenizer("MKTUBZOX")["input_ids"] == ProteinTokenizer().encode("MKTUBZOX").tolist()
    # the converted file predicts like the folder
    fasta = write_fasta(tmp_path / "x.fasta", sequences)
    for name, checkpoint in (("a", tmp_path / "hf"), ("b", converted)):
        invoke(
            "run",
            "predict",
            "--checkpoint",
            str(checkpoint),
            "--data",
            str(fasta),
            "--output-dir",
            str(tmp_path / name),
        )
    a = read_predictions(tmp_path / "a" / "predictions.safetensors")[1]
    b = read_predictions(tmp_path / "b" / "predictions.safetensors")[1]
    torch.testing.assert_close(a["embeddings"], b["embeddings"], rtol=0, atol=0)


def test_train_from_a_hugging_face_folder_starts_from_its_weights(tmp_path):
    # the esm2-demo recipe's shape: 4 x 64, 4 heads, ffn 256
    random_hf_esm(tmp_path / "hf", hidden=64, heads=4, layers=4, ffn=256)
    out = tmp_path / "run"
    invoke(
        "run", "train", "--checkpoint", str(tmp_path / "hf"), "--max-steps", "1", "--lr", "1e-12",
        "--output-dir", str(out), "--accelerator", "cpu",
    )  # fmt: skip
    trained = load_file(out / "model.safetensors")
    invoke("convert", "from-hf", str(tmp_path / "hf"), str(tmp_path / "start.safetensors"))
    start = load_file(tmp_path / "start.safetensors")
    # the contact head, fit to the attention maps of the weights it came with, is not carried into trained weights
    start = {name: value for name, value in start.items() if not name.startswith("contact_head.")}
    assert trained.keys() == start.keys()
    for name, value in start.items():
        torch.testing.assert_close(trained[name], value, rtol=0, atol=1e-6, msg=name)


def _nan(tensors):
    tensors["esm.encoder.layer.1.intermediate.dense.weight"][3, 4] = float("nan")


def _drop(tensors):
    del tensors["esm.encoder.layer.0.attention.self.key.weight"]


def _truncate(folder: Path) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


BAD_FOLDERS = {
    "no config.json": (lambda f: (f / "config.json").unlink(), "config.json"),
    "another model type": (lambda f: mutate_config(f, model_type="bert"), "bert"),
    "shapes disagree": (
        lambda f: mutate_config(f, intermediate_size=100), "esm.encoder.layer.0.intermediate.dense.weight"
    ),
    "missing tensor": (lambda f: edit_weights(f, _drop), "esm.encoder.layer.0.attention.self.key.weight"),
    "truncated file": (_truncate, "cannot be read"),
    "NaN weights": (lambda f: edit_weights(f, _nan), "NaN"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_FOLDERS))
def test_bad_hugging_face_folders_exit_2_naming_the_problem_and_write_nothing(tmp_path, case):
    folder = tmp_path / "hf"
    random_hf_esm(folder)
    damage, message = BAD_FOLDERS[case]
    damage(folder)
    out = tmp_path / "out"
    for args in (
        ["run", "predict", "--checkpoint", str(folder), "--output-dir", str(out)],
        ["convert", "from-hf", str(folder), str(out / "w.safetensors")],
    ):
        result = runner.invoke(app, args, terminal_width=400)
        assert result.exit_code == 2, result.output
        assert message in flat(result.output), result.output
        assert len(result.output.splitlines()) < 25
        assert not out.exists()


def test_to_hf_refuses_a_non_empty_folder_without_force(tmp_path):
    random_hf_esm(tmp_path / "hf")
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["convert", "to-hf", str(tmp_path / "hf"), str(target)], terminal_width=400)
    assert result.exit_code == 2
    assert "--force" in flat(result.output)
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    invoke("convert", "to-hf", str(tmp_path / "hf"), str(target), "--force")
    assert (target / "config.json").is_file()


def test_train_refuses_a_checkpoint_of_another_shape_than_the_recipe(tmp_path):
    random_hf_esm(tmp_path / "hf", hidden=64, heads=4, layers=2)
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["run", "train", "--checkpoint", str(tmp_path / "hf"), "--output-dir", str(out)], terminal_width=400
    )
    assert result.exit_code == 2
    assert "num_layers=2" in flat(result.output)
    assert "recipe esm2-demo has num_layers=4" in flat(result.output)
    assert not out.exists()
    missing = runner.invoke(app, ["run", "train", "--checkpoint", str(tmp_path / "nope"), "--output-dir", str(out)])
    assert missing.exit_code == 2
    assert "does not exist" in flat(missing.output)


def test_a_bionemo_weights_file_with_nan_or_missing_tensors_exits_2(tmp_path):
    from safetensors import safe_open

    from bionemo.esm2.recipes import BUNDLED_CHECKPOINT

    with safe_open(str(BUNDLED_CHECKPOINT), framework="pt") as f:
        metadata = f.metadata()
        tensors = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118
    tensors["decoder.layers.2.mlp.linear_fc1.weight"][0, 0] = float("inf")
    flipped = tmp_path / "flipped.safetensors"
    save_file(tensors, str(flipped), metadata=metadata)
    del tensors["lm_head.dense.bias"]
    missing = tmp_path / "missing.safetensors"
    save_file(tensors, str(missing), metadata=metadata)
    for path, message in (
        (flipped, "decoder.layers.2.mlp.linear_fc1.weight holds NaN or Inf"),
        (missing, "lm_head.dense.bias"),
    ):
        out = tmp_path / "out"
        result = runner.invoke(
            app, ["run", "predict", "--checkpoint", str(path), "--output-dir", str(out)], terminal_width=400
        )
        assert result.exit_code == 2, result.output
        assert message in flat(result.output)
        assert not out.exists()
