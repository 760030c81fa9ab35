"""ESM2Model computes what transformers' EsmForMaskedLM computes (fp32, random weights, several shapes)."""

import pytest
import torch

from bionemo.esm2.checkpoint import load_checkpoint
from bionemo.esm2.tokenizer import ProteinTokenizer
from support.distributed import run_distributed
from support.hf_esm import hf_outputs, random_hf_esm, random_sequences

SHAPES = [  # hidden, heads, layers, token_dropout: head dims 16, 8 and 32
    (64, 4, 2, True),
    (64, 8, 3, False),
    (96, 3, 2, True),
]


def padded_batch(sequences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    tokenizer = ProteinTokenizer()
    encoded = [tokenizer.encode(s) for s in sequences]
    length = max(len(e) for e in encoded)
    ids = torch.full((len(encoded), length), tokenizer.pad_id)
    mask = torch.zeros(len(encoded), length, dtype=torch.bool)
    for row, e in enumerate(encoded):
        ids[row, : len(e)] = e
        mask[row, : len(e)] = True
    return ids, mask


def bionemo_outputs(folder, sequences: list[str], tp: int = 1, keep: dict | None = None):
    """Our logits per sequence ``[L + 2, 33]`` and mean residue embeddings, from one padded batch.

    ``keep["model"]`` receives the model when given.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state

    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.weights import apply_weights

    checkpoint = load_checkpoint(folder)
    config = ESM2Config(tensor_model_parallel_size=tp, **checkpoint.model)
    model = config.configure_model().eval()
    apply_weights(model, checkpoint.tensors)
    if keep is not None:
        keep["model"] = model
    ids, mask = padded_batch(sequences)
    with torch.no_grad():
        logits, hidden = model(ids, mask, output_hidden=True)
    if tp > 1:  # gather the vocabulary slices (megatron's own gather needs CUDA)
        shards = [torch.empty_like(logits) for _ in range(tp)]
        dist.all_gather(shards, logits.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
        logits = torch.cat(shards, dim=-1)
    logits, hidden = logits.transpose(0, 1)[..., :33], hidden.transpose(0, 1)
    lengths = mask.sum(1).tolist()
    per_sequence = [logits[i, :n] for i, n in enumerate(lengths)]
    embeddings = torch.stack([hidden[i, 1 : n - 1].mean(0) for i, n in enumerate(lengths)])
    return per_sequence, embeddings


def assert_parity(ours, reference, atol: float = 1e-4) -> None:
    (logits, embeddings), (ref_logits, ref_embeddings) = ours, reference
    for mine, theirs in zip(logits, ref_logits, strict=True):
        assert mine.shape == theirs.shape
        torch.testing.assert_close(mine, theirs, rtol=0, atol=atol)
    torch.testing.assert_close(embeddings, ref_embeddings, rtol=0, atol=atol)


@pytest.mark.parametrize(("hidden", "heads", "layers", "token_dropout"), SHAPES)
def test_logits_and_hidden_states_match_transformers(tmp_path, hidden, heads, layers, token_dropout):
    from bionemo.lightning._parallel_init import ensure_model_parallel

    ensure_model_parallel()
    hf = random_hf_esm(tmp_path, hidden=hidden, heads=heads, layers=layers, token_dropout=token_dropout)
    sequences = random_sequences(6, seed=hidden + layers)
    assert_parity(bionemo_outputs(tmp_path, sequences), hf_outputs(hf, sequences))


def test_token_dropout_matches_transformers_with_masked_tokens(tmp_path):
    """<mask> tokens: zeroed embeddings, rescaled by the sequence's own mask ratio (no padding in the batch)."""
    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.weights import apply_weights
    from bionemo.lightning._parallel_init import ensure_model_parallel

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
    from bionemo.lightning._parallel_init import ensure_model_parallel

    ensure_model_parallel()
    random_hf_esm(tmp_path)
    sequences = random_sequences(5, seed=9)
    alone = bionemo_outputs(tmp_path, sequences[:1])
    together = bionemo_outputs(tmp_path, sequences)
    torch.testing.assert_close(together[0][0], alone[0][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(together[1][0], alone[1][0], rtol=0, atol=1e-5)


def _tp_worker(rank, world_size, folder, sequences):
    from megatron.core import parallel_state

    from bionemo.esm2.weights import full_state_dict

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)
    keep: dict = {}
    logits, embeddings = bionemo_outputs(folder, sequences, tp=world_size, keep=keep)
    return {"logits": logits, "embeddings": embeddings, "full": full_state_dict(keep["model"])}


@pytest.mark.multiprocess
def test_tensor_parallel_2_over_gloo_matches_transformers(tmp_path):
    hf = random_hf_esm(tmp_path, hidden=64, heads=4, layers=2)
    sequences = random_sequences(5, seed=4)
    reference = hf_outputs(hf, sequences)
    results = run_distributed(_tp_worker, 2, tmp_path, sequences)
    for result in results:
        assert_parity((result["logits"], result["embeddings"]), reference)
    # weights held under TP=2 export whole: back to Hugging Face, the same logits as the original
    from transformers import EsmForMaskedLM

    from bionemo.esm2.hf import bionemo_to_hf, write_hf_folder
    from bionemo.esm2.weights import unpadded

    model = load_checkpoint(tmp_path).model
    write_hf_folder(tmp_path / "export", bionemo_to_hf(unpadded(results[0]["full"], 33), model), model)
    exported = EsmForMaskedLM.from_pretrained(tmp_path / "export").eval()
    for mine, theirs in zip(hf_outputs(exported, sequences)[0], reference[0], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)
