"""Prediction on unpadded (concatenated) sequences gives the padded path's outputs and transformers' states."""

import torch

from bionemo.esm2.checkpoints.load import load_checkpoint
from bionemo.esm2.data import collate_proteins
from bionemo.esm2.model.packing import repad, unpad
from support.hf_esm import random_hf_esm, random_sequences


def _model_and_batch(tmp_path, token_dropout: bool = True):
    from bionemo.esm2.checkpoints.weights import apply_weights
    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    hf = random_hf_esm(tmp_path, hidden=64, heads=4, layers=3, token_dropout=token_dropout)
    checkpoint = load_checkpoint(tmp_path)
    model = ESM2Config(**checkpoint.model).configure_model().eval()
    apply_weights(model, checkpoint.tensors)
    tokenizer = ProteinTokenizer()
    sequences = random_sequences(5, seed=11)
    items = [{"tokens": tokenizer.encode(s)} for s in sequences]
    batch = collate_proteins(items, tokenizer.pad_id)
    batch["padding"] = batch["attention_mask"]
    return hf, model, batch, tokenizer


def test_unpad_and_repad_round_trip():
    tokens = torch.tensor([[5, 6, 7, 1], [8, 9, 1, 1], [3, 4, 5, 6]])
    ids, sequences, index = unpad(tokens, [3, 2, 4])
    assert ids.tolist() == [[5, 6, 7, 8, 9, 3, 4, 5, 6]]
    assert sequences.boundaries.tolist() == [0, 3, 5, 9]  # type: ignore[union-attr]
    assert sequences.positions.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]  # type: ignore[union-attr]
    assert sequences.sequence_ids.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]  # type: ignore[union-attr]
    assert sequences.longest == 4
    back = repad(ids.T.unsqueeze(-1), index, 3, 4)  # [T, 1, 1] -> [s, b, 1]
    assert back[..., 0].T.tolist() == [[5, 6, 7, 0], [8, 9, 0, 0], [3, 4, 5, 6]]


def test_unpadded_step_equals_padded_step_and_transformers(tmp_path):
    from bionemo.esm2.model.steps import make_predict_step

    hf, model, batch, _ = _model_and_batch(tmp_path)
    options = {"embeddings": True, "logits": True, "perplexity": False, "residues": True, "cls": True}
    options |= {"layers": [0, 2], "num_layers": 3}
    with torch.no_grad():
        padded = make_predict_step(**options)(model, batch)  # type: ignore[arg-type]
        unpadded = make_predict_step(**options, unpadded=True)(model, batch)  # type: ignore[arg-type]
        states = hf(input_ids=batch["tokens"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    assert padded.keys() == unpadded.keys()
    for key in padded:
        torch.testing.assert_close(unpadded[key], padded[key], rtol=0, atol=1e-5, msg=key)
    real = batch["attention_mask"]
    torch.testing.assert_close(unpadded["logits"], states.logits * real[..., None], rtol=0, atol=1e-4)
    residues = real.clone()
    residues[:, 0] = False
    residues[torch.arange(len(real)), real.sum(1) - 1] = False
    for layer, key in ((0, "embeddings.layer0"), (2, "embeddings.layer2"), (3, "embeddings")):
        reference = (states.hidden_states[layer] * residues[..., None]).sum(1) / residues.sum(1, keepdim=True)
        torch.testing.assert_close(unpadded[key], reference, rtol=0, atol=1e-4, msg=key)


def test_unpadded_perplexities_equal_the_padded_ones(tmp_path):
    from bionemo.esm2.model.steps import make_predict_step

    _, model, batch, tokenizer = _model_and_batch(tmp_path)
    generator = torch.Generator().manual_seed(3)
    chosen = (torch.rand(batch["tokens"].shape, generator=generator) < 0.3) & batch["attention_mask"].bool()
    chosen[:, 0] = False
    chosen[torch.arange(len(chosen)), batch["attention_mask"].sum(1) - 1] = False  # residues only
    batch["masked_tokens"] = torch.where(chosen, torch.full_like(batch["tokens"], tokenizer.mask_id), batch["tokens"])
    batch["labels"] = torch.where(chosen, batch["tokens"], torch.full_like(batch["tokens"], -100))
    options = {"embeddings": False, "logits": False, "perplexity": True, "pseudo_perplexity": True}
    with torch.no_grad():
        padded = make_predict_step(**options)(model, batch)
        unpadded = make_predict_step(**options, unpadded=True)(model, batch)
    for key in ("perplexity", "pseudo_perplexity"):
        assert torch.isfinite(padded[key]).all()
        assert (padded[key] > 1).all()
        torch.testing.assert_close(unpadded[key], padded[key], rtol=1e-5, atol=0, msg=key)


def test_unpadded_token_dropout_scales_each_sequence_by_its_own_mask_ratio(tmp_path):
    """Each sequence alone is the reference: transformers 4.57.6 divides by the padded length in padded batches
    (``EsmModel`` does not pass the attention mask to its embeddings); fair-esm and this model use the real one."""
    hf, model, batch, tokenizer = _model_and_batch(tmp_path, token_dropout=True)
    tokens = batch["tokens"].clone()
    tokens[0, [2, 3]] = tokenizer.mask_id
    tokens[3, 1] = tokenizer.mask_id
    ids, sequences, index = unpad(tokens, batch["host_lengths"])
    with torch.no_grad():
        ours = repad(model(ids, None, unpadded=sequences), index, *tokens.shape).transpose(0, 1)[..., :33]
        for row, length in enumerate(batch["host_lengths"]):
            reference = hf(input_ids=tokens[row : row + 1, :length]).logits[0]
            torch.testing.assert_close(ours[row, :length], reference, rtol=0, atol=1e-4)


def test_unpadded_flag_off_a_gpu_is_refused_before_anything_is_written(tmp_path):
    from typer.testing import CliRunner

    from bionemo.cli.app import app

    random_hf_esm(tmp_path / "hf")
    out = tmp_path / "out"
    args = ["run", "predict", "--checkpoint", str(tmp_path / "hf"), "--output-dir", str(out), "--unpadded"]
    result = CliRunner().invoke(app, [*args, "--accelerator", "cpu"], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "--unpadded needs CUDA GPUs" in result.output
    assert not out.exists()
