"""Fine-tuning heads: the hf heads are transformers' heads exactly; the others match plain per-sequence references."""

import json

import pytest
import torch
import torch.nn.functional as F
from transformers import EsmConfig, EsmForSequenceClassification, EsmForTokenClassification
from transformers.models.esm.modeling_esm import EsmClassificationHead

from bionemo.esm2.finetune.head_config import (
    HEADS_EXPORTABLE_TO_HF,
    HEADS_FOR_TASK,
    HeadChoice,
    HeadConfig,
    HeadKind,
    head_config,
)
from bionemo.esm2.finetune.heads import ConvTokenHead, HFSequenceHead, HFTokenHead, MeanPoolMLPHead, build_head
from bionemo.esm2.finetune.tasks import OptionError, Task

H = 16


def tiny_config(num_labels: int) -> EsmConfig:
    return EsmConfig(
        vocab_size=33,
        hidden_size=H,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        position_embedding_type="rotary",
        pad_token_id=1,
        mask_token_id=32,
        num_labels=num_labels,
        hidden_dropout_prob=0.3,
        token_dropout=False,
    )


def batch(lengths: list[int], width: int | None = None, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random hidden states [b, s, h] and the residue mask (True at positions 1..n) for sequences of ``lengths``."""
    width = width or max(lengths) + 2
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(len(lengths), width, H, generator=generator)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, n in enumerate(lengths):
        mask[row, 1 : n + 1] = True
    return hidden, mask


def test_hf_sequence_head_is_transformers_classification_head():
    config = tiny_config(3)
    ours = HFSequenceHead(H, 3, dropout=0.3)
    theirs = EsmClassificationHead(config)
    theirs.load_state_dict(ours.state_dict())  # same names and shapes, strictly
    hidden, mask = batch([5, 3])
    ours.eval()
    theirs.eval()
    torch.testing.assert_close(ours(hidden, mask), theirs(hidden), atol=1e-6, rtol=0)
    ours.train()  # the same dropout draws in the same order
    theirs.train()
    torch.manual_seed(7)
    expected = theirs(hidden)
    torch.manual_seed(7)
    torch.testing.assert_close(ours(hidden, mask), expected, atol=1e-6, rtol=0)


def test_hf_heads_load_from_and_match_esm_for_classification_models():
    torch.manual_seed(0)
    ids = torch.tensor([[0, 5, 6, 7, 8, 2], [0, 9, 10, 2, 1, 1]])
    attention = ids != 1
    # EsmForSequenceClassification's classifier.{dense,out_proj} are HFSequenceHead's {dense,out_proj};
    # EsmForTokenClassification's classifier is HFTokenHead's classifier
    pairs = [
        (EsmForSequenceClassification, HFSequenceHead, "classifier."),
        (EsmForTokenClassification, HFTokenHead, ""),
    ]
    for model_class, head_class, prefix in pairs:
        model = model_class(tiny_config(4)).eval()
        head = head_class(H, 4).eval()
        weights = {k.removeprefix(prefix): v for k, v in model.state_dict().items() if k.startswith("classifier.")}
        head.load_state_dict(weights)  # strictly: every name and shape maps 1:1
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=attention, output_hidden_states=True)
            logits = head(out.hidden_states[-1], attention)
        torch.testing.assert_close(logits, out.logits, atol=1e-6, rtol=0)


def test_mean_pool_mlp_head_pools_residues_only():
    head = MeanPoolMLPHead(H, 2, mlp_hidden_size=8, dropout=0.25).eval()
    lengths = [4, 1, 6]
    hidden, mask = batch(lengths)
    got = head(hidden, mask)
    for row, n in enumerate(lengths):
        pooled = hidden[row, 1 : n + 1].mean(dim=0)
        expected = F.linear(
            F.relu(F.linear(pooled, head.dense.weight, head.dense.bias)), head.out_proj.weight, head.out_proj.bias
        )
        torch.testing.assert_close(got[row], expected, atol=1e-6, rtol=0)
    wider, wider_mask = batch(lengths, width=12, seed=1)
    wider[:, : hidden.shape[1]] = hidden  # other values at <eos>/padding beyond the old width
    torch.testing.assert_close(head(wider, wider_mask), got, atol=1e-6, rtol=0)
    assert head(hidden, torch.zeros_like(mask)).isfinite().all()  # no residues: no division by zero


def test_conv_token_head_sees_residues_only_whatever_the_padding():
    head = ConvTokenHead(H, 3, channels=5, kernel_size=3, dropout=0.25).eval()
    lengths = [6, 2]
    hidden, mask = batch(lengths, width=10)
    got = head(hidden, mask)
    assert got.shape == (2, 10, 3)
    for row, n in enumerate(lengths):
        residues = hidden[row, 1 : n + 1].T.unsqueeze(0)  # [1, h, n]: the sequence alone, zero-padded at its ends
        x = F.conv1d(residues, head.conv.weight, head.conv.bias, padding=1)[0].T
        expected = F.linear(F.relu(x), head.classifier.weight, head.classifier.bias)
        torch.testing.assert_close(got[row, 1 : n + 1], expected, atol=1e-6, rtol=0)
    noisy = torch.where(mask.unsqueeze(-1), hidden, torch.full_like(hidden, 1e3))  # <cls>, <eos>, padding changed
    torch.testing.assert_close(head(noisy, mask)[mask], got[mask], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="odd"):
        ConvTokenHead(H, 3, kernel_size=4)


@pytest.mark.parametrize("make", [HFSequenceHead, HFTokenHead, MeanPoolMLPHead, ConvTokenHead])
def test_training_dropout_of_a_sample_does_not_depend_on_its_batch_or_padding(make):
    """Keyed by ``sample_index``: one process, any micro-batch size or DP rank drops the same elements."""
    torch.manual_seed(0)
    head = make(H, 3, dropout=0.5).train()
    lengths = [6, 2, 4]
    hidden, mask = batch(lengths, width=10)
    index = torch.tensor([40, 7, 12])
    together = head(hidden, mask, index)
    torch.manual_seed(1)  # torch's random stream plays no part
    alone = head(hidden[2:], mask[2:], index[2:])
    torch.testing.assert_close(together[2:], alone, atol=1e-6, rtol=0)  # batch size changes rounding only
    wider, wider_mask = batch(lengths, width=14, seed=1)
    wider[:, :10] = hidden
    wider_mask[:, :10] = mask
    padded = head(wider, wider_mask, index)
    torch.testing.assert_close(padded[:, :10] if padded.dim() == 3 else padded, together, atol=1e-6, rtol=0)
    head.dropout.step = 1  # the next optimizer step draws other masks
    assert not torch.equal(head(hidden, mask, index), together)
    assert not torch.equal(head.eval()(hidden, mask, index), together)  # and evaluation none


def test_build_head_builds_each_kind_with_its_sizes():
    built = build_head(HeadConfig(kind=HeadKind.HF_SEQUENCE, dropout=0.2), H, 3)
    assert isinstance(built, HFSequenceHead)
    assert (built.out_proj.out_features, built.dropout.p) == (3, 0.2)
    built = build_head(HeadConfig(kind=HeadKind.HF_TOKEN), H, 5)
    assert isinstance(built, HFTokenHead)
    assert (built.classifier.out_features, built.dropout.p) == (5, 0.1)
    built = build_head(HeadConfig(kind=HeadKind.MEAN_MLP, hidden_size=12), H, 1)
    assert isinstance(built, MeanPoolMLPHead)
    assert (built.dense.out_features, built.out_proj.out_features, built.dropout.p) == (12, 1, 0.25)
    built = build_head(HeadConfig(kind=HeadKind.CONV_TOKEN, kernel_size=5), H, 2)
    assert isinstance(built, ConvTokenHead)
    assert (built.conv.out_channels, built.conv.kernel_size, built.classifier.out_features) == (32, (5,), 2)


def test_head_config_is_json_and_validated():
    config = HeadConfig(kind=HeadKind.CONV_TOKEN, hidden_size=8, dropout=0.0, kernel_size=3)
    assert HeadConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    assert HeadConfig(kind=HeadKind.MEAN_MLP).to_json() == {
        "kind": "mean-mlp",
        "hidden_size": 256,
        "dropout": 0.25,
        "kernel_size": None,
    }
    for bad, message in [
        ({"kind": "mlp"}, "'mlp' is not a valid HeadKind"),
        ({"kind": HeadKind.MEAN_MLP, "dropout": 1.0}, "dropout must lie in"),
        ({"kind": HeadKind.MEAN_MLP, "hidden_size": 0}, "hidden_size must be a positive"),
        ({"kind": HeadKind.HF_SEQUENCE, "hidden_size": 8}, "width is the encoder's"),
        ({"kind": HeadKind.CONV_TOKEN, "kernel_size": 2}, "positive odd"),
        ({"kind": HeadKind.MEAN_MLP, "kernel_size": 3}, "conv-token head only"),
        ({"kind": HeadKind.HF_TOKEN, "channels": 3}, r"unknown keys \['channels'\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            HeadConfig.from_json(bad)


def test_head_choice_per_task_and_which_export():
    assert head_config(Task.CLASSIFICATION, HeadChoice.HF).kind is HeadKind.HF_SEQUENCE
    assert head_config(Task.TOKEN_CLASSIFICATION, "hf").kind is HeadKind.HF_TOKEN
    assert head_config(Task.REGRESSION, "mlp", hidden_size=64).hidden_size == 64
    assert head_config(Task.TOKEN_REGRESSION, "conv").kind is HeadKind.CONV_TOKEN
    assert all(
        kind.per_residue == task.per_residue for task, heads in HEADS_FOR_TASK.items() for kind in heads.values()
    )
    assert (
        {k for k in HeadKind if HeadConfig(kind=k).exportable_to_hf}
        == HEADS_EXPORTABLE_TO_HF
        == {HeadKind.HF_SEQUENCE, HeadKind.HF_TOKEN}
    )
    for task, choice, valid in [
        (Task.TOKEN_REGRESSION, "hf", "EsmForTokenClassification has no regression); valid for token-regression: conv"),
        (Task.REGRESSION, "conv", "valid for regression: hf, mlp"),
        (Task.TOKEN_CLASSIFICATION, "mlp", "valid for token-classification: hf, conv"),
    ]:
        with pytest.raises(OptionError, match=f"--head {choice} cannot do --task {task}") as error:
            head_config(task, choice)
        assert valid in str(error.value)
        assert error.value.option == "--head"


def test_package_exports_every_public_name():
    import bionemo.esm2.finetune as finetune

    for name in finetune.__all__:
        assert getattr(finetune, name) is not None
    assert finetune.build_head is build_head
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = finetune.nothing
