"""bionemo.esm2.hf against transformers' EsmForMaskedLM: round trips, the qkv layout, tokenizer files, bad folders."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from bionemo.esm2.hf.files import bionemo_to_hf, hf_to_bionemo, load_hf_checkpoint, read_hf_tensors, write_hf_folder
from bionemo.esm2.hf.layout import (
    ESM_VOCAB,
    CheckpointError,
    hf_config,
    is_hf_folder,
    padded_vocab_size,
    read_hf_config,
)
from support.hf_esm import edit_weights, mutate_config

transformers = pytest.importorskip("transformers")

SEQUENCES = ["MKTAYIAKQRUBZOX", "LAGVSERTIDPKQNFYMHWC", "MK<mask>AY"]


def random_model(*, hidden: int = 64, heads: int = 4, layers: int = 2, token_dropout: bool = True, seed: int = 0):
    """A small EsmForMaskedLM with every parameter random, LayerNorms included."""
    config = transformers.EsmConfig(
        vocab_size=33,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=1026,
        position_embedding_type="rotary",
        token_dropout=token_dropout,
        mask_token_id=32,
        pad_token_id=1,
        emb_layer_norm_before=False,
        layer_norm_eps=1e-5,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(seed)
    model = transformers.EsmForMaskedLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            torch.nn.init.normal_(param, std=0.1)
    return model


def save(model, folder: Path, safetensors: bool = True) -> Path:
    model.save_pretrained(folder, safe_serialization=safetensors)
    return folder


def vocab_tokenizer(tmp_path: Path):
    vocab = tmp_path / "vocab" / "vocab.txt"
    vocab.parent.mkdir(exist_ok=True)
    vocab.write_text("\n".join(ESM_VOCAB))
    return transformers.EsmTokenizer(str(vocab))


def batch(tmp_path: Path) -> dict[str, torch.Tensor]:
    return vocab_tokenizer(tmp_path)(SEQUENCES, padding=True, return_tensors="pt")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    return save(random_model(), tmp_path_factory.mktemp("hf") / "esm")


def round_trip(folder: Path, out: Path, padded: int = 40) -> Path:
    tensors, model, _ = load_hf_checkpoint(folder, padded)
    return write_hf_folder(out, bionemo_to_hf(tensors, model), model)


@pytest.mark.parametrize(
    ("hidden", "heads", "token_dropout", "safetensors"),
    [(64, 4, True, True), (64, 8, False, True), (48, 3, True, False)],
    ids=["head-dim-16", "head-dim-8-no-token-dropout", "head-dim-16-bin"],
)
def test_round_trip_gives_identical_parameters_and_logits(tmp_path, hidden, heads, token_dropout, safetensors):
    original = random_model(hidden=hidden, heads=heads, token_dropout=token_dropout, seed=hidden + heads)
    folder = save(original, tmp_path / "hf", safetensors=safetensors)
    assert (folder / ("model.safetensors" if safetensors else "pytorch_model.bin")).is_file()
    tensors, model, notes = load_hf_checkpoint(folder, padded_vocab_size(33))
    assert model == {
        "num_layers": 2,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "ffn_hidden_size": 2 * hidden,
        "seq_length": 1026,
        "layernorm_epsilon": 1e-5,
        "token_dropout": token_dropout,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "vocab_size": 33,
        "rotary_base": 10000.0,
    }
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors.values())
    assert tensors["embedding.word_embeddings.weight"].shape == (40, hidden)
    assert tensors["embedding.word_embeddings.weight"][33:].eq(0).all()
    assert tensors["output_layer.bias"][33:].eq(0).all()
    assert "output_layer.weight" not in tensors
    assert tensors["contact_head.regression.weight"].shape == (1, 2 * heads)  # kept, not ignored
    assert len(notes) == 1
    assert "contact_head" not in notes[0]
    assert "inv_freq" in notes[0]

    out = write_hf_folder(tmp_path / "deep" / "out", bionemo_to_hf(tensors, model), model)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    assert [p.name for p in out.parent.iterdir()] == ["out"]  # no temporary folder left beside it
    with safe_open(out / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert "lm_head.decoder.weight" not in f.keys()  # noqa: SIM118
    config = transformers.EsmConfig.from_pretrained(out)
    assert config.token_dropout is token_dropout
    assert config.position_embedding_type == "rotary"
    assert (config.vocab_size, config.mask_token_id, config.pad_token_id) == (33, 32, 1)

    loaded, info = transformers.EsmForMaskedLM.from_pretrained(out, output_loading_info=True)
    loaded.eval()
    assert info["missing_keys"] == []
    assert info["unexpected_keys"] == []
    assert info["mismatched_keys"] == []
    assert loaded.lm_head.decoder.weight is loaded.esm.embeddings.word_embeddings.weight  # tied on load
    mine, theirs = loaded.state_dict(), original.state_dict()
    assert mine.keys() == theirs.keys()
    for name, value in theirs.items():
        assert torch.equal(mine[name], value), name
    inputs = batch(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, original(**inputs).logits, rtol=0, atol=1e-6)


def test_qkv_rows_are_interleaved_per_head(hf_folder):
    hf = read_hf_tensors(hf_folder)
    tensors, model, _ = load_hf_checkpoint(hf_folder, 33)
    h, n = model["hidden_size"], model["num_attention_heads"]
    d = h // n
    qkv_w = tensors["decoder.layers.1.self_attention.linear_qkv.weight"]
    qkv_b = tensors["decoder.layers.1.self_attention.linear_qkv.bias"]
    layer = "esm.encoder.layer.1.attention.self."
    # head 1: rows [3d, 4d) are q_1, [4d, 5d) are k_1, [5d, 6d) are v_1
    for offset, part in enumerate(("query", "key", "value")):
        rows = slice((3 * 1 + offset) * d, (3 * 1 + offset + 1) * d)
        assert torch.equal(qkv_w[rows], hf[f"{layer}{part}.weight"][d : 2 * d])
        assert torch.equal(qkv_b[rows], hf[f"{layer}{part}.bias"][d : 2 * d])
    # last head's value rows end the tensor
    assert torch.equal(qkv_w[-d:], hf[f"{layer}value.weight"][-d:])
    # the documented formula
    q, k, v = (hf[f"{layer}{p}.weight"].view(n, d, h) for p in ("query", "key", "value"))
    assert torch.equal(qkv_w, torch.stack([q, k, v], dim=1).reshape(3 * h, h))
    # and back
    back = bionemo_to_hf(tensors, model)
    for part in ("query", "key", "value"):
        assert torch.equal(back[f"{layer}{part}.weight"], hf[f"{layer}{part}.weight"])


def test_vocabulary_padding_and_cut(hf_folder):
    assert [padded_vocab_size(33), padded_vocab_size(33, 2), padded_vocab_size(32), padded_vocab_size(33, 4)] == [
        40,
        48,
        32,
        64,
    ]
    hf = read_hf_tensors(hf_folder)
    model = read_hf_config(hf_folder)
    tensors, _ = hf_to_bionemo(hf, model, 48)
    assert tensors["embedding.word_embeddings.weight"].shape == (48, 64)
    assert tensors["output_layer.bias"].shape == (48,)
    back = bionemo_to_hf(tensors, model)
    assert torch.equal(back["esm.embeddings.word_embeddings.weight"], hf["esm.embeddings.word_embeddings.weight"])
    assert torch.equal(back["lm_head.bias"], hf["lm_head.bias"])
    with pytest.raises(ValueError, match="below"):
        hf_to_bionemo(hf, model, 32)


def test_names_without_the_esm_prefix_and_unknown_tensors_are_noted(hf_folder):
    hf = read_hf_tensors(hf_folder)
    model = read_hf_config(hf_folder)
    plain = {name.removeprefix("esm."): value for name, value in hf.items()}
    plain["lm_head.decoder.weight"] = plain["embeddings.word_embeddings.weight"]
    plain["pooler.dense.weight"] = torch.zeros(2)
    tensors, notes = hf_to_bionemo(plain, model, 33)
    reference, _ = hf_to_bionemo(hf, model, 33)
    assert tensors.keys() == reference.keys()
    assert all(torch.equal(tensors[k], reference[k]) for k in tensors)
    assert len(notes) == 2
    assert "lm_head.decoder.weight" in notes[0]
    assert "contact_head" not in notes[0]  # converted
    assert notes[1].startswith("ignored:")
    assert "pooler.dense.weight" in notes[1]


def test_written_tokenizer_encodes_like_the_original(tmp_path, hf_folder):
    out = round_trip(hf_folder, tmp_path / "out")
    assert (out / "vocab.txt").read_text().split() == list(ESM_VOCAB)
    written = transformers.EsmTokenizer.from_pretrained(out)
    reference = vocab_tokenizer(tmp_path)
    from bionemo.esm2.tokenizer import ESM_TOKENS, ProteinTokenizer

    assert ESM_VOCAB == ESM_TOKENS
    for sequence in ("MKTAYIAKQRUBZOX", "LAGVSERTIDPKQNFYMHWC"):
        ids = written(sequence)["input_ids"]
        assert ids == reference(sequence)["input_ids"]
        assert ids == ProteinTokenizer().encode(sequence).tolist()
    assert written("MK<mask>A")["input_ids"] == reference("MK<mask>A")["input_ids"]
    assert (written.mask_token_id, written.pad_token_id, written.cls_token_id, written.eos_token_id) == (32, 1, 0, 2)
    assert written.unk_token_id == 3


def test_hf_config_loads_in_transformers():
    model = {
        "num_layers": 3,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "ffn_hidden_size": 80,
        "seq_length": 1026,
        "layernorm_epsilon": 1e-5,
        "token_dropout": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "vocab_size": 33,
    }
    config = transformers.EsmConfig.from_dict(hf_config(model))
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (3, 32, 80)
    assert config.architectures == ["EsmForMaskedLM"]
    assert config.tie_word_embeddings


def test_is_hf_folder(tmp_path):
    assert is_hf_folder(tmp_path)
    (tmp_path / "w.safetensors").write_bytes(b"")
    assert not is_hf_folder(tmp_path / "w.safetensors")
    assert not is_hf_folder(tmp_path / "nope")


# ------------------------------------------------------------------------------------------------- bad input


def _drop_key(tensors) -> None:
    del tensors["esm.encoder.layer.0.attention.self.key.weight"]


def _nan(tensors) -> None:
    tensors["esm.encoder.layer.1.intermediate.dense.weight"][3, 4] = float("nan")


def _inf(tensors) -> None:
    tensors["lm_head.bias"][0] = float("inf")


def _truncate(folder: Path) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


BAD_FOLDERS = {
    "no config.json": (lambda f: (f / "config.json").unlink(), ["config.json", "model.safetensors"]),
    "broken json": (lambda f: (f / "config.json").write_text("{"), ["config.json", "JSON"]),
    "model_type bert": (lambda f: mutate_config(f, model_type="bert"), ["'bert'", "esm"]),
    "absolute positions": (lambda f: mutate_config(f, position_embedding_type="absolute"), ["rotary", "ESM-1"]),
    "layer norm before": (lambda f: mutate_config(f, emb_layer_norm_before=True), ["emb_layer_norm_before"]),
    "esmfold": (lambda f: mutate_config(f, is_folding_model=True), ["ESMFold"]),
    "vocab 35": (lambda f: mutate_config(f, vocab_size=35), ["vocab_size 35", "33"]),
    "heads do not divide": (lambda f: mutate_config(f, num_attention_heads=5), ["not divisible", "5"]),
    "hidden size disagrees": (
        lambda f: mutate_config(f, hidden_size=32, num_attention_heads=2),
        ["esm.embeddings.word_embeddings.weight", "(33, 64)", "(33, 32)", "config"],
    ),
    "intermediate size disagrees": (
        lambda f: mutate_config(f, intermediate_size=100),
        ["tensor esm.encoder.layer.0.intermediate.dense.weight has shape (128, 64), the config needs (100, 64)"],
    ),
    "missing tensor": (
        lambda f: edit_weights(f, _drop_key),
        ["esm.encoder.layer.0.attention.self.key.weight", "missing"],
    ),
    "truncated file": (_truncate, ["model.safetensors", "cannot be read"]),
    "no weights": (
        lambda f: (f / "model.safetensors").unlink(),
        ["no weights", "model.safetensors", "pytorch_model.bin", "pytorch_model.bin.index.json"],
    ),
    "NaN weight": (lambda f: edit_weights(f, _nan), ["esm.encoder.layer.1.intermediate.dense.weight", "NaN"]),
    "Inf bias": (lambda f: edit_weights(f, _inf), ["lm_head.bias", "Inf"]),
}


@pytest.mark.parametrize("case", sorted(BAD_FOLDERS))
def test_bad_folders_raise_checkpoint_errors_naming_the_problem(tmp_path, hf_folder, case):
    folder = tmp_path / "hf"
    folder.mkdir()
    for path in hf_folder.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    damage, expected = BAD_FOLDERS[case]
    damage(folder)
    with pytest.raises(CheckpointError) as error:
        load_hf_checkpoint(folder, 40)
    message = str(error.value)
    for part in expected:
        assert part in message, message
    assert str(folder) in message
    assert isinstance(error.value, ValueError)


def test_truncated_pytorch_bin_and_sharded_index(tmp_path):
    model = random_model(seed=3)
    folder = save(model, tmp_path / "bin", safetensors=False)
    path = folder / "pytorch_model.bin"
    full = read_hf_tensors(folder)
    # a sharded safetensors folder reads the same tensors
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    names = sorted(full)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, keys in halves.items():
        save_file({k: full[k].clone() for k in keys}, str(sharded / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keys, shard))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    again = read_hf_tensors(sharded)
    assert again.keys() == full.keys()
    assert all(torch.equal(again[k], full[k]) for k in full)
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        read_hf_tensors(sharded)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="pytorch_model.bin cannot be read"):
        read_hf_tensors(folder)


def test_bionemo_side_errors(hf_folder):
    tensors, model, _ = load_hf_checkpoint(hf_folder, 40)
    incomplete = dict(tensors)
    del incomplete["decoder.layers.1.mlp.linear_fc2.bias"]
    with pytest.raises(CheckpointError, match=r"decoder\.layers\.1\.mlp\.linear_fc2\.bias"):
        bionemo_to_hf(incomplete, model)
    bad = dict(tensors)
    bad["decoder.final_layernorm.weight"] = bad["decoder.final_layernorm.weight"].clone()
    bad["decoder.final_layernorm.weight"][0] = float("nan")
    with pytest.raises(CheckpointError, match=r"decoder\.final_layernorm\.weight holds NaN"):
        bionemo_to_hf(bad, model)
    with pytest.raises(
        CheckpointError, match=r"embedding\.word_embeddings\.weight has shape \(40, 64\), the config needs \(33, 32\)"
    ):
        bionemo_to_hf(tensors, {**model, "hidden_size": 32, "num_attention_heads": 2})
    many = {k: v for k, v in tensors.items() if not k.startswith("decoder.layers.")}
    with pytest.raises(CheckpointError, match=r"24 bionemo tensor\(s\) are missing: .* and 14 more"):
        bionemo_to_hf(many, model)


def test_non_empty_output_folder_is_refused_without_force(tmp_path, hf_folder):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    tensors, model, _ = load_hf_checkpoint(hf_folder, 40)
    hf = bionemo_to_hf(tensors, model)
    with pytest.raises(CheckpointError, match="not empty"):
        write_hf_folder(target, hf, model)
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["target"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="not a folder"):
        write_hf_folder(tmp_path / "file", hf, model)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert write_hf_folder(empty, hf, model) == empty
    write_hf_folder(target, hf, model, force=True)
    assert not (target / "keep.txt").exists()
    assert (target / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "file", "target"]


def test_a_failed_write_leaves_nothing_behind(tmp_path, hf_folder):
    tensors, model, _ = load_hf_checkpoint(hf_folder, 40)
    hf = bionemo_to_hf(tensors, model)
    with pytest.raises(KeyError):
        write_hf_folder(tmp_path / "out", hf, {"num_layers": 2})  # config.json cannot be built
    assert list(tmp_path.iterdir()) == []
