"""`run train --global-batch-tokens`: how a step's tokens are split, what is refused, and the masked micro-batches.

Checked against the definitions: a step of up to B tokens over R data-parallel ranks takes the fewest micro-batches per
rank that keep one to micro-batch size x seq_length tokens on average; every micro-batch must be able to hold two of
the longest sequences; a sequence's mask depends on the seed, the pass and the sequence only.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.esm2.data.demo import demo_families
from bionemo.esm2.data.mlm import MaskedTokenBatches
from bionemo.esm2.data.readers import SequenceRecord
from bionemo.esm2.data.token_batches import TokenBatches
from bionemo.esm2.recipes.token_steps import TokenSteps, token_steps, training_tokens
from bionemo.esm2.tokenizer import ProteinTokenizer
from bionemo.recipes.registry import RecipeDefaults
from bionemo.recipes.resolved import resolved_training_settings
from bionemo.recipes.settings import Precision, RunSettings, SettingsError

runner = CliRunner()


def _settings(**values) -> RunSettings:
    return RunSettings.model_validate({"micro_batch_size": 2, **values})


@given(
    budget=st.integers(1, 200_000),
    micro=st.integers(1, 64),
    seq_length=st.integers(16, 2048),
    ranks=st.integers(1, 8),
)
@settings(max_examples=200, deadline=None)
def test_a_step_takes_the_fewest_micro_batches_per_rank_within_the_micro_batch_tokens(budget, micro, seq_length, ranks):
    steps = TokenSteps(budget, micro * seq_length, ranks)
    assert steps.parts == ranks * steps.per_rank
    assert budget / steps.parts <= micro * seq_length  # on average within a micro-batch's tokens
    if steps.per_rank > 1:  # and one fewer per rank would not be
        assert budget / (ranks * (steps.per_rank - 1)) > micro * seq_length


def test_batches_by_count_need_no_split():
    assert token_steps(_settings(), 1026, {"training": [10, 20]}) is None


@pytest.mark.parametrize(
    ("values", "option", "message"),
    [
        ({"micro_batch_size": 1}, "--micro-batch-size", "give --micro-batch-size of at least 2"),
        ({"global_batch_tokens": 300}, "--global-batch-tokens", "give at least 400"),
    ],
)
def test_refusals_name_the_option_and_a_valid_value(values, option, message):
    run = _settings(**{"global_batch_tokens": 4000, **values})
    with pytest.raises(SettingsError) as error:
        token_steps(run, 100, {"training": [100] * 50, "validation": [100] * 50})
    assert error.value.option == option
    assert message in str(error.value)


@given(budget=st.integers(1, 50_000), micro=st.integers(2, 8), ranks=st.integers(1, 4), longest=st.integers(3, 100))
@settings(max_examples=200, deadline=None)
def test_the_budget_suggested_is_accepted_and_no_smaller_one_of_the_same_split_is(budget, micro, ranks, longest):
    seq_length = 100
    lengths = {"training": [longest] * 1000, "validation": [longest] * 1000}
    run = _settings(global_batch_tokens=budget, micro_batch_size=micro, devices=ranks)
    try:
        steps = token_steps(run, seq_length, lengths)
    except SettingsError as error:
        suggested = int(str(error).rsplit(" ", 1)[1])
        assert suggested > budget
        fixed = token_steps(run.model_copy(update={"global_batch_tokens": suggested}), seq_length, lengths)
        assert fixed is not None
        assert fixed.parts == TokenSteps(budget, micro * seq_length, ranks).parts
        return
    assert steps is not None
    assert budget >= 2 * steps.parts * longest
    # what TokenBatches asks of its budget holds
    TokenBatches(lengths["training"], budget, parts=steps.parts, steps=1)


def test_a_set_smaller_than_a_step_s_micro_batches_is_refused():
    run = _settings(global_batch_tokens=2000, micro_batch_size=2)  # 2000 / (2 x 100): 10 micro-batches
    with pytest.raises(SettingsError, match="3 validation sequences cannot fill the 10 micro-batches per step"):
        token_steps(run, 100, {"training": [50] * 100, "validation": [50] * 3})


def test_resolved_settings_keep_the_micro_batch_size_and_leave_the_global_batch_size_unset():
    from bionemo.esm2.recipes import esm2_650m

    defaults = esm2_650m().defaults  # micro-batches of 16, global batches of 256
    run = resolved_training_settings(RunSettings(global_batch_tokens=5000, devices=3), defaults, gpu=True)
    assert (run.micro_batch_size, run.global_batch_size, run.global_batch_tokens) == (16, None, 5000)
    with pytest.raises(SettingsError, match="give one or the other") as error:
        resolved_training_settings(RunSettings(global_batch_tokens=5000, global_batch_size=8), defaults, gpu=True)
    assert error.value.option == "--global-batch-tokens"


@pytest.mark.parametrize(
    ("given", "gpu", "expected"),
    [
        ({}, True, 256 * 1026),  # GPUs: the recipe's 256 full-length sequences in tokens
        ({}, False, None),  # CPUs: by count
        ({"global_batch_size": 64}, True, None),  # by count when asked for
        ({"micro_batch_size": 4}, True, 256 * 1026),  # a smaller micro-batch only bounds the micro-batches' tokens
        ({"global_batch_tokens": 5000}, False, 5000),
        ({"global_batch_tokens": 5000}, True, 5000),
    ],
)
def test_training_cuts_batches_by_tokens_on_gpus_unless_a_global_batch_size_is_given(given, gpu, expected):
    from bionemo.esm2.recipes import esm2_650m

    assert training_tokens(RunSettings.model_validate(given), esm2_650m().defaults, gpu=gpu) == expected


def _records(n: int, seed: int = 0) -> list[SequenceRecord]:
    gen = torch.Generator().manual_seed(seed)
    alphabet = "ACDEFGHIKLMNPQRSTVWY"
    lengths = torch.randint(5, 60, (n,), generator=gen).tolist()
    return [
        SequenceRecord(f"s{i}", "".join(alphabet[k] for k in torch.randint(20, (m,), generator=gen).tolist()))
        for i, m in enumerate(lengths)
    ]


def _masked(records: list[SequenceRecord], parts: int, steps: int = 12, seed: int = 3) -> MaskedTokenBatches:
    lengths = [len(r.sequence) + 2 for r in records]
    batches = TokenBatches(lengths, 600, parts=parts, seed=seed, steps=steps)
    return MaskedTokenBatches(records, ProteinTokenizer(), batches, seed=seed)


def test_micro_batches_hold_their_records_masked_afresh_each_pass_and_alike_on_every_split():
    records = _records(40)
    by_parts = {parts: _masked(records, parts) for parts in (1, 2, 4)}
    masks: dict[int, dict[tuple[int, int], torch.Tensor]] = {}
    for parts, data in by_parts.items():
        assert len(data) == 12 * parts
        seen: dict[tuple[int, int], torch.Tensor] = {}
        for item in range(len(data)):
            samples = data[item]
            assert [int(s["sample_index"]) for s in samples] == data.batches.records(item)
            epoch = data.batches.pass_of(item // parts)
            for sample in samples:
                index = int(sample["sample_index"])
                residues = ProteinTokenizer().encode(records[index].sequence)
                chosen = sample["labels"] >= 0
                assert chosen.any()
                assert torch.equal(sample["labels"][chosen], residues[chosen])  # labels: the original residues
                assert torch.equal(sample["loss_mask"], chosen.float())
                seen[epoch, index] = sample["tokens"]
        masks[parts] = seen
    assert masks[1].keys() == masks[2].keys() == masks[4].keys()
    for key, tokens in masks[1].items():
        assert torch.equal(masks[2][key], tokens), key
        assert torch.equal(masks[4][key], tokens), key
    passes = sorted({epoch for epoch, _ in masks[1]})
    assert len(passes) >= 2  # 12 steps of 600 tokens go round the ~1,400 tokens several times
    again = [i for i in range(len(records)) if (passes[0], i) in masks[1] and (passes[1], i) in masks[1]]
    differ = sum(not torch.equal(masks[1][passes[0], i], masks[1][passes[1], i]) for i in again)
    assert differ > len(again) // 2  # a sequence is masked afresh when it comes round again


def test_cli_refuses_a_budget_too_small_with_exit_code_2_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    args = ["run", "train", "--accelerator", "cpu", "--global-batch-tokens", "100", "--output-dir", str(out)]
    result = runner.invoke(app, args, terminal_width=400)
    assert result.exit_code == 2, result.output
    longest = max(len(r.sequence) for r in demo_families(seed=0)[0]) + 2  # the demo data, <cls> and <eos>
    assert f"give at least {2 * longest}" in " ".join(result.output.replace("│", " ").split())
    assert not out.exists()


def test_recipes_that_cut_by_tokens_on_gpus_need_a_sequence_length_and_show_their_budget():
    defaults = {"micro_batch_size": 4, "global_batch_size": 8, "max_steps": 1, "val_check_interval": 1, "lr": 0.1}
    without = RecipeDefaults(**defaults, precision=Precision.BF16, tokens_on_gpus=True)
    with pytest.raises(ValueError, match="needs the model's seq_length"):
        without.global_batch_tokens()
    recipe = RecipeDefaults(**defaults, precision=Precision.BF16, tokens_on_gpus=True, model={"seq_length": 100})
    assert recipe.global_batch_tokens() == 800
    assert (recipe.as_settings()["global_batch_size"], recipe.as_settings()["global_batch_tokens"]) == (None, 800)
    assert recipe.for_training(gpu=False).global_batch_tokens() is None
    assert recipe.for_training(gpu=False).as_settings()["global_batch_size"] == 8
