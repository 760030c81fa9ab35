"""ESM-2 contact prediction: equal to transformers' ``predict_contacts``, the head kept through conversion, refusals."""

from pathlib import Path
from typing import Any, cast

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.esm2.recipes import BUNDLED_CHECKPOINT
from bionemo.recipes.outputs import read_predictions, split_contacts
from bionemo.recipes.settings import Include, RunSettings, SettingsError
from support.hf_esm import edit_weights, padded_batch, random_hf_esm, random_sequences

runner = CliRunner()

HEAD = ("esm.contact_head.regression.weight", "esm.contact_head.regression.bias")


def flat(output: str) -> str:
    for border in "│╭╮╰╯─":
        output = output.replace(border, " ")
    return " ".join(output.split())


def has(output: str, text: str) -> bool:
    """Whether ``text`` is in the output, whitespace aside (rich breaks long paths inside the error box)."""
    return "".join(text.split()) in "".join(flat(output).split())


def invoke(*args: str, code: int = 0):
    result = runner.invoke(app, list(args), terminal_width=400)
    assert result.exit_code == code, result.output + repr(result.exception)
    return result


def predict_args(tmp_path: Path, checkpoint: Path, sequences: list[str], name: str, *more: str) -> list[str]:
    fasta = tmp_path / f"{name}.fasta"
    fasta.write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(sequences)))
    return ["run", "predict", "--checkpoint", str(checkpoint), "--data", str(fasta),
            "--output-dir", str(tmp_path / name), "--accelerator", "cpu", *more]  # fmt: skip


def reference_contacts(folder: Path, sequences: list[str]) -> list[torch.Tensor]:
    """transformers' ``predict_contacts`` of one padded batch of every sequence (eager attention returns maps)."""
    from transformers import EsmForMaskedLM

    model = EsmForMaskedLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids, mask = padded_batch(sequences)
    with torch.no_grad():
        contacts = model.predict_contacts(ids, mask.long())
    return [contacts[i, : len(s), : len(s)] for i, s in enumerate(sequences)]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("contacts") / "hf"
    random_hf_esm(folder, hidden=64, heads=4, layers=3, seed=7)  # the contact head is random too
    return folder


def test_predict_contacts_equal_transformers_in_input_order_whatever_the_batching(tmp_path, hf_folder):
    sequences = random_sequences(7, seed=11, low=3, high=30)
    reference = reference_contacts(hf_folder, sequences)
    outputs = {}
    # length-sorted batches of 3 (three padded lengths) joined into one shard, and one batch of all
    for mbs, interval, dtype in (("3", "epoch", "float32"), ("7", "batch", "bfloat16")):
        invoke(*predict_args(tmp_path, hf_folder, sequences, f"mbs{mbs}", "--include", "contacts",
                             "--include", "embeddings", "--micro-batch-size", mbs,
                             "--write-interval", interval, "--output-dtype", dtype))  # fmt: skip
        ids, outputs[mbs] = read_predictions(tmp_path / f"mbs{mbs}" / "predictions.safetensors")
        assert ids == [f"s{i}" for i in range(7)]
    tensors = outputs["3"]
    lengths = [len(s) for s in sequences]
    assert tensors["contacts"].dtype == torch.float32
    assert tensors["contacts"].shape == (sum(n * n for n in lengths),)
    assert tensors["contact_offsets"].tolist() == torch.tensor([0, *(n * n for n in lengths)]).cumsum(0).tolist()
    parts = split_contacts(tensors)
    assert [tuple(p.shape) for p in parts] == [(n, n) for n in lengths]
    for mine, theirs in zip(parts, reference, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-4)
        torch.testing.assert_close(mine, mine.T, rtol=0, atol=1e-6)  # symmetric, as the maps are symmetrized
    assert outputs["7"]["embeddings"].dtype == torch.bfloat16
    assert outputs["7"]["contacts"].dtype == torch.float32  # probabilities stay float32, as perplexities do
    torch.testing.assert_close(outputs["7"]["contacts"], tensors["contacts"], rtol=0, atol=1e-5)


def test_from_hf_to_hf_keeps_the_contact_head_bit_exact(tmp_path, hf_folder):
    from transformers import EsmForMaskedLM

    converted = tmp_path / "esm.safetensors"
    result = invoke("convert", "from-hf", str(hf_folder), str(converted))
    assert "contact" not in flat(result.output)  # converted, not ignored with a note
    original = load_file(hf_folder / "model.safetensors")
    mine = load_file(converted)
    for name in HEAD:
        assert torch.equal(mine[name.removeprefix("esm.")], original[name])
    invoke("convert", "to-hf", str(converted), str(tmp_path / "back"))
    back = load_file(tmp_path / "back" / "model.safetensors")
    for name in HEAD:
        assert back[name].dtype == original[name].dtype
        assert torch.equal(back[name], original[name])
    loaded, info = cast(Any, EsmForMaskedLM.from_pretrained(tmp_path / "back", output_loading_info=True))
    assert info["missing_keys"] == []  # nothing newly initialized: the contact head is the file's
    assert torch.equal(loaded.esm.contact_head.regression.weight.detach(), original[HEAD[0]])
    # the converted file predicts the same contacts as the folder it came from (the model, without the CLI)
    from bionemo.esm2.checkpoints.load import load_checkpoint
    from bionemo.esm2.checkpoints.weights import apply_weights
    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.model.contacts import ContactHead
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    checkpoint = load_checkpoint(converted)
    assert checkpoint.contact_head
    model = ESM2Config(**checkpoint.model).configure_model().eval()
    apply_weights(model, checkpoint.tensors)
    sequences = random_sequences(3, seed=12)
    ids, mask = padded_batch(sequences)
    contacts = ContactHead.from_tensors(checkpoint.tensors, checkpoint.model).logits(ids, mask)
    with torch.no_grad():
        plain = model(ids, mask, output_hidden=True)
        watched = model(ids, mask, output_hidden=True, attention_maps=contacts)
    for core in (layer.self_attention.core_attention for layer in model.decoder.layers):
        assert not core._forward_pre_hooks  # the attention hooks are gone after the forward
    for a, b in zip(plain, watched, strict=True):
        assert torch.equal(a, b)  # the maps are computed beside the attention kernel, which runs as without them
    for i, reference in enumerate(reference_contacts(hf_folder, sequences)):
        n = len(sequences[i])
        torch.testing.assert_close(contacts.probabilities()[i, :n, :n], reference, rtol=0, atol=1e-4)


def test_checkpoints_without_a_contact_head_convert_and_refuse_contacts(tmp_path, hf_folder):
    from bionemo.esm2.checkpoints.header import read_checkpoint_header

    assert read_checkpoint_header(hf_folder).contact_head is True
    assert read_checkpoint_header(BUNDLED_CHECKPOINT).contact_head is False
    sequences = random_sequences(2, seed=13)
    result = invoke(*predict_args(tmp_path, BUNDLED_CHECKPOINT, sequences, "bundled", "--include", "contacts"), code=2)
    assert has(result.output, f"--include contacts: checkpoint {BUNDLED_CHECKPOINT} has no contact head")
    assert not (tmp_path / "bundled").exists()
    # a Hugging Face folder without one converts both ways and loads (transformers initializes a random head)
    bare = tmp_path / "bare"
    random_hf_esm(bare, hidden=32, heads=2, layers=1)
    edit_weights(bare, lambda tensors: [tensors.pop(name) for name in HEAD])
    assert read_checkpoint_header(bare).contact_head is False
    invoke("convert", "from-hf", str(bare), str(tmp_path / "bare.safetensors"))
    assert read_checkpoint_header(tmp_path / "bare.safetensors").contact_head is False
    invoke("convert", "to-hf", str(tmp_path / "bare.safetensors"), str(tmp_path / "bare_back"))
    assert not set(HEAD) & set(load_file(tmp_path / "bare_back" / "model.safetensors"))
    result = invoke(*predict_args(tmp_path, bare, sequences, "bare_out", "--include", "contacts"), code=2)
    assert has(result.output, f"checkpoint {bare} has no contact head")


def test_pytorch_bin_folders_show_their_contact_head_once_read(tmp_path):
    from bionemo.esm2.checkpoints.header import read_checkpoint_header
    from bionemo.esm2.recipes.inputs import checked_checkpoint
    from bionemo.esm2.recipes.predict import _check_contacts

    folder = tmp_path / "bin"
    random_hf_esm(folder, hidden=32, heads=2, layers=1, safetensors=False)
    header = read_checkpoint_header(folder)
    assert header.contact_head is None  # a torch pickle: its tensors are not listed without reading it
    asked = RunSettings(include=[Include.CONTACTS])
    _check_contacts(asked, header)  # not known yet: passes
    checkpoint = checked_checkpoint(folder)
    assert checkpoint.contact_head
    _check_contacts(asked, checkpoint)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    for name in HEAD:
        state.pop(name)
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(SettingsError, match="has no contact head") as refused:
        _check_contacts(asked, checked_checkpoint(folder))
    assert refused.value.option == "--include"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop(HEAD[1]), "the contact head is incomplete: esm.contact_head.regression.weight is there"),
        (
            lambda t: t.update({HEAD[0]: torch.zeros(1, 5)}),
            "esm.contact_head.regression.weight has shape (1, 5), the config needs (1, 2)",
        ),
        (lambda t: t.update({HEAD[1]: torch.tensor([float("nan")])}), "holds NaN or Inf"),
    ],
    ids=["half", "shape", "nan"],
)
def test_damaged_contact_heads_are_refused(tmp_path, edit, message):
    folder = tmp_path / "hf"
    random_hf_esm(folder, hidden=32, heads=2, layers=1)
    edit_weights(folder, edit)
    result = invoke("convert", "from-hf", str(folder), str(tmp_path / "x.safetensors"), code=2)
    assert message in flat(result.output)
    assert not (tmp_path / "x.safetensors").exists()


def test_layouts_that_cannot_see_every_attention_map_are_refused(tmp_path, hf_folder):
    from bionemo.esm2.recipes.predict import _check_contacts, _check_pipeline_outputs, _unpadded

    sequences = random_sequences(2, seed=14)
    result = invoke(*predict_args(tmp_path, hf_folder, sequences, "u", "--include", "contacts", "--unpadded"), code=2)
    assert "--unpadded: contacts come from attention maps of padded batches" in flat(result.output)
    assert not (tmp_path / "u").exists()
    contacts = [Include.CONTACTS]
    assert _unpadded(RunSettings(include=contacts)) is False  # contacts predict on padded batches
    pp = RunSettings(devices=2, pipeline_parallel=2, strategy="megatron", include=[Include.EMBEDDINGS, *contacts])
    with pytest.raises(SettingsError, match="--pipeline-parallel 2 predicts .* not contacts") as refused:
        _check_pipeline_outputs(pp, [], num_layers=3)
    assert refused.value.option == "--include"
    header = type("Header", (), {"contact_head": True, "path": hf_folder})()
    for option in ("tensor_parallel", "context_parallel"):
        settings = RunSettings(devices=2, strategy="megatron", include=contacts, **{option: 2})
        flag = "--" + option.replace("_", "-")
        with pytest.raises(SettingsError, match=f"{flag} 2 splits them: predict contacts with {flag} 1") as refused:
            _check_contacts(settings, header)
        assert refused.value.option == flag
    _check_contacts(RunSettings(devices=2, strategy="megatron", include=contacts), header)  # data parallel: fine


def test_the_step_and_the_model_refuse_maps_they_cannot_compute(hf_folder):
    from bionemo.esm2.checkpoints.load import load_checkpoint
    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.model.contacts import ContactHead
    from bionemo.esm2.model.packing import unpad
    from bionemo.esm2.model.steps import make_predict_step
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    checkpoint = load_checkpoint(hf_folder)
    head = ContactHead.from_tensors(checkpoint.tensors, checkpoint.model)
    model = ESM2Config(**checkpoint.model).configure_model().eval()
    ids, mask = padded_batch(random_sequences(2, seed=15))
    batch = {"tokens": ids, "attention_mask": mask, "padding": mask, "host_lengths": mask.sum(1)}
    step = make_predict_step(embeddings=False, logits=False, perplexity=False, unpadded=True, contact_head=head)
    with pytest.raises(ValueError, match="contacts: padded batches at tensor parallel size 1 only"):
        step(model, batch)
    tokens, sequences, _ = unpad(ids, mask.sum(1))
    with pytest.raises(ValueError, match="attention maps: padded batches of a whole model"):
        model(tokens, None, unpadded=sequences, attention_maps=head.logits(ids, mask))
    for core in (layer.self_attention.core_attention for layer in model.decoder.layers):
        assert not core._forward_pre_hooks
    with pytest.raises(ValueError, match="has no contact head"):
        ContactHead.from_tensors({}, checkpoint.model)
