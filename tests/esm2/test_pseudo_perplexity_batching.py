"""The pseudo-perplexity's masked copies run in forward passes of up to a token budget; the values never change."""

import random
from types import SimpleNamespace

import pytest
import torch

from bionemo.esm2.checkpoints.load import load_checkpoint
from bionemo.esm2.data import collate_proteins
from bionemo.esm2.model.masked_copies import copy_groups
from bionemo.esm2.recipes.pseudo_perplexity import (
    PseudoPerplexityTimer,
    cost_line,
    pseudo_perplexity_cost,
    remaining_line,
)
from support.hf_esm import random_hf_esm, random_sequences


def test_copy_groups_cover_every_copy_once_within_the_budget_and_are_cut_greedily():
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(3, 60) for _ in range(rng.randint(1, 8))]
        budget = rng.choice([1, 7, 50, 300, 5000])
        unpadded = rng.random() < 0.5
        owner = [i for i, length in enumerate(lengths) for _ in range(length - 2)]  # copy -> its sequence
        groups = copy_groups(lengths, budget, unpadded=unpadded)
        assert [g[0] for g in groups] == [0, *(g[1] for g in groups[:-1])]
        assert groups[-1][1] == len(owner)

        widths = [lengths[i] for i in owner]
        for start, stop, width in groups:
            assert width == max(widths[start:stop])
            assert _size(widths[start:stop], unpadded) <= budget or stop - start == 1
            if stop < len(owner):
                assert _size(widths[start : stop + 1], unpadded) > budget  # greedy: the next copy did not fit


def _size(widths: list[int], unpadded: bool) -> int:
    return sum(widths) if unpadded else len(widths) * max(widths)


def _model_and_batch(tmp_path):
    from bionemo.esm2.checkpoints.weights import apply_weights
    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.lightning import ensure_model_parallel

    ensure_model_parallel()
    hf = random_hf_esm(tmp_path, hidden=64, heads=4, layers=2)
    checkpoint = load_checkpoint(tmp_path)
    model = ESM2Config(**checkpoint.model).configure_model().eval()
    apply_weights(model, checkpoint.tensors)
    tokenizer = ProteinTokenizer()
    sequences = sorted(random_sequences(4, seed=21, low=4, high=24), key=len, reverse=True)
    batch = collate_proteins([{"tokens": tokenizer.encode(s)} for s in sequences], tokenizer.pad_id)
    batch["padding"] = batch["attention_mask"]
    return hf, model, batch, sequences, tokenizer


def _transformers_pseudo_perplexity(hf, sequences, tokenizer) -> torch.Tensor:
    expected = []
    for sequence in sequences:
        ids = tokenizer.encode(sequence)
        positions = torch.arange(1, len(sequence) + 1)
        copies = ids.repeat(len(sequence), 1)
        copies[torch.arange(len(sequence)), positions] = tokenizer.mask_id
        with torch.no_grad():
            log_probs = hf(input_ids=copies).logits.log_softmax(-1)
        expected.append(torch.exp(-log_probs[torch.arange(len(sequence)), positions, ids[positions]].mean()))
    return torch.stack(expected)


class _Counting(torch.nn.Module):
    """The model, counting its forward passes and the largest batch of tokens one of them held."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls, self.largest = model, 0, 0

    def forward(self, tokens, *args, **kwargs):
        self.calls += 1
        self.largest = max(self.largest, tokens.numel())
        return self.model(tokens, *args, **kwargs)


@pytest.mark.parametrize("unpadded", [False, True])
def test_every_budget_gives_transformers_pseudo_perplexity_in_the_planned_forward_passes(tmp_path, unpadded):
    from bionemo.esm2.model.steps import make_predict_step

    hf, model, batch, sequences, tokenizer = _model_and_batch(tmp_path)
    expected = _transformers_pseudo_perplexity(hf, sequences, tokenizer)
    lengths = batch["host_lengths"]
    whole = sum(n - 2 for n in lengths) * max(lengths)  # every copy padded to the longest
    calls = {}
    for budget in (1, 40, 100, 333, whole, None):
        counting = _Counting(model)
        step = make_predict_step(
            embeddings=False, logits=False, perplexity=False, pseudo_perplexity=True, unpadded=unpadded,
            pseudo_perplexity_tokens=budget,
        )  # fmt: skip
        with torch.no_grad():
            out = step(counting, batch)
        torch.testing.assert_close(out["pseudo_perplexity"], expected, rtol=1e-5, atol=1e-5, msg=str(budget))
        planned = budget or len(lengths) * max(lengths)  # None: the batch's padded size
        assert counting.calls == len(copy_groups(lengths, planned, unpadded=unpadded)), budget
        if not unpadded:  # padded: each pass is [copies, longest]; unpadded passes are [1, real tokens]
            assert counting.largest <= max(planned, max(lengths)), budget
        calls[budget] = counting.calls
    assert calls[1] == sum(n - 2 for n in lengths)  # one copy per pass
    assert calls[whole] == 1  # every copy of the batch in one pass
    assert calls[1] > calls[40] > calls[333] > calls[whole]


def test_cost_line_counts_copies_forward_passes_and_the_ratio_to_embeddings():
    batches = [[12, 10], [7]]  # tokens per sequence: 10, 8 and 5 residues
    cost = pseudo_perplexity_cost(batches, budget=40)
    assert (cost.sequences, cost.copies) == (3, 23)
    assert cost.forwards == len(copy_groups([12, 10], 40)) + len(copy_groups([7], 40)) == 6 + 1
    assert cost.ratio == pytest.approx((10 * 12 + 8 * 10 + 5 * 7) / (12 + 10 + 7))
    line = cost_line(cost)
    assert line.startswith("pseudo-perplexity: 3 sequences, 23 masked copies")
    assert "in 7 forward passes of up to 40 tokens: about 8x the cost of embeddings" in line


def test_timer_prints_the_rest_at_the_first_batch_speed_once():
    now = [100.0]
    lines: list[str] = []
    timer = PseudoPerplexityTimer([10, 30, 50], write=lines.append, clock=lambda: now[0])
    timer.on_predict_start(SimpleNamespace(global_rank=0), None)  # type: ignore[arg-type]
    timer.on_predict_batch_start(None, None, None, 0)  # type: ignore[arg-type]
    now[0] = 112.0  # the first batch took 12 s for a cost of 10: the other 80 take 96 s
    timer.on_predict_batch_end(None, None, None, None, 0)  # type: ignore[arg-type]
    timer.on_predict_batch_start(None, None, None, 1)  # type: ignore[arg-type]
    now[0] = 150.0
    timer.on_predict_batch_end(None, None, None, None, 1)  # type: ignore[arg-type]
    assert lines == [remaining_line(12.0, 10, 80)]
    assert "the first batch took 12 s; about 1 min 36 s left" in lines[0]
    assert "about 2 h 00 min left" in remaining_line(3600.0, 1, 2)
    other_rank = PseudoPerplexityTimer([10, 30], write=lines.append, clock=lambda: now[0])
    other_rank.on_predict_start(SimpleNamespace(global_rank=1), None)  # type: ignore[arg-type]
    other_rank.on_predict_batch_start(None, None, None, 0)  # type: ignore[arg-type]
    other_rank.on_predict_batch_end(None, None, None, None, 0)  # type: ignore[arg-type]
    assert len(lines) == 1


def test_predict_prints_the_cost_and_keeps_transformers_values_at_a_small_budget(tmp_path):
    from typer.testing import CliRunner

    from bionemo.cli.app import app
    from bionemo.esm2.data import length_sorted_batches
    from bionemo.esm2.tokenizer import ProteinTokenizer
    from bionemo.recipes.outputs import read_predictions

    hf = random_hf_esm(tmp_path / "hf", hidden=64, heads=4, layers=2)
    sequences = random_sequences(5, seed=9, low=6, high=30)
    fasta = tmp_path / "s.fasta"
    fasta.write_text("".join(f">s{i}\n{s}\n" for i, s in enumerate(sequences)))
    out = tmp_path / "out"
    args = ["run", "predict", "--checkpoint", str(tmp_path / "hf"), "--data", str(fasta), "--output-dir", str(out)]
    budget = 64
    result = CliRunner().invoke(app, [*args, "--include", "pseudo-perplexity", "--tokens-per-batch", str(budget)])
    assert result.exit_code == 0, result.output
    lengths = [len(s) + 2 for s in sequences]
    plan = length_sorted_batches(lengths, tokens_per_batch=budget)
    forwards = sum(len(copy_groups([lengths[i] for i in batch], budget)) for batch in plan)
    copies = sum(map(len, sequences))
    assert f"pseudo-perplexity: 5 sequences, {copies} masked copies" in result.output, result.output
    assert f"in {forwards} forward passes of up to {budget} tokens" in result.output, result.output
    expected = _transformers_pseudo_perplexity(hf, sequences, ProteinTokenizer())
    got = read_predictions(out / "predictions.safetensors")[1]["pseudo_perplexity"]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
