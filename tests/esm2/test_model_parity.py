"""ESM2Model computes what transformers' EsmForMaskedLM computes (fp32, random weights, several shapes)."""

import pytest
import torch

from bionemo.esm2.checkpoints.load import load_checkpoint
from support.distributed import run_distributed
from support.hf_esm import bionemo_outputs, esm2_hf_tp_worker, hf_outputs, padded_batch, random_hf_esm, random_sequences

SHAPES = [  # hidden, heads, layers, token_dropout: head dims 16, 8 and 32
    (64, 4, 2, True),
    (64, 8, 3, False),
    (96, 3, 2, True),
]


def assert_parity(ours, reference, atol: float = 1e-4) -> None:
    (logits, embeddings), (ref_logits, ref_embeddings) = ours, reference
    for mine, theirs in zip(logits, ref_logits, strict=True):
        assert mine.shape == theirs.shape
        torch.testing.assert_close(mine, theirs, rtol=0, atol=atol)
    torch.testing.assert_close(embeddings, ref_embeddings, rtol=0, atol=atol)


@pytest.mark.parametrize(("hidden", "heads", "layers", "token_dropout"), SHAPES)
def test_logits_and_hidden_states_match_transformers(tmp_path, hidden, heads, layers, token_dropout):
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    hf = random_hf_esm(tmp_path, hidden=hidden, heads=heads, layers=layers, token_dropout=token_dropout)
    sequences = random_sequences(6, seed=hidden + layers)
    assert_parity(bionemo_outputs(tmp_path, sequences), hf_outputs(hf, sequences))


def test_token_dropout_matches_transformers_with_masked_tokens(tmp_path):
    """<mask> tokens: zeroed embeddings, rescaled by the sequence's own mask ratio (no padding in the batch)."""
    from bionemo.esm2.checkpoints.weights import apply_weights
    from bionemo.esm2.model import ESM2Config
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    hf = random_hf_esm(tmp_path, token_dropout=True)
    checkpoint = load_checkpoint(tmp_path)
    model = ESM2Config(**checkpoint.model).configure_model().eval()
    apply_weights(model, checkpoint.tensors)
    ids, _ = padded_batch(random_sequences(2, seed=3, low=30, high=31))
    ids[0, [3, 7, 8]] = 32
    ids[1, 5] = 32
    with torch.no_grad():
        ours = model(ids).transpose(0, 1)[..., :33]
        reference = hf(input_ids=ids).logits
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-4)


def test_a_sequence_gets_the_same_outputs_whatever_its_batch_neighbours(tmp_path):
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    random_hf_esm(tmp_path)
    sequences = random_sequences(5, seed=9)
    alone = bionemo_outputs(tmp_path, sequences[:1])
    together = bionemo_outputs(tmp_path, sequences)
    torch.testing.assert_close(together[0][0], alone[0][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(together[1][0], alone[1][0], rtol=0, atol=1e-5)


@pytest.mark.multiprocess
def test_tensor_parallel_2_over_gloo_matches_transformers(tmp_path):
    hf = random_hf_esm(tmp_path, hidden=64, heads=4, layers=2)
    sequences = random_sequences(5, seed=4)
    reference = hf_outputs(hf, sequences)
    results = run_distributed(esm2_hf_tp_worker, 2, tmp_path, sequences)
    for result in results:
        assert_parity((result["logits"], result["embeddings"]), reference)
    # weights held under TP=2 export whole: back to Hugging Face, the same logits as the original
    from transformers import EsmForMaskedLM

    from bionemo.esm2.checkpoints.weights import unpadded
    from bionemo.esm2.hf.files import bionemo_to_hf, write_hf_folder

    model = load_checkpoint(tmp_path).model
    write_hf_folder(tmp_path / "export", bionemo_to_hf(unpadded(results[0]["full"], 33), model), model)
    exported = EsmForMaskedLM.from_pretrained(tmp_path / "export").eval()
    for mine, theirs in zip(hf_outputs(exported, sequences)[0], reference[0], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)
