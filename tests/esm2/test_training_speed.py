"""Training throughput figures: model FLOPs against torch's FLOP counter, tokens/s and share of peak from the steps
a timer timed, and the peak table."""

from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bionemo.esm2.data.mlm import MaskedProteinDataset, MaskedTokenBatches
from bionemo.esm2.data.readers import SequenceRecord
from bionemo.esm2.model.flops import training_flops
from bionemo.esm2.recipes.train_speed import speed_rows, training_speed
from bionemo.esm2.tokenizer import ProteinTokenizer, encoded_length
from bionemo.recipes.peak_flops import bf16_dense_peak_tflops


def _plain_training_pass(model: dict, vocab: int, tokens: int) -> None:
    """Forward and backward of ESM-2's matmuls written out for one sequence (no batching, no elementwise work)."""
    h, ffn = model["hidden_size"], model["ffn_hidden_size"]
    heads = 2
    x = torch.randn(tokens, h, requires_grad=True)
    out = x
    for _ in range(model["num_layers"]):
        qkv = torch.nn.functional.linear(out, torch.randn(3 * h, h, requires_grad=True))
        q, k, v = (t.reshape(tokens, heads, h // heads).transpose(0, 1) for t in qkv.split(h, dim=-1))
        attention = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        projection = torch.randn(h, h, requires_grad=True)
        out = out + torch.nn.functional.linear(attention.transpose(0, 1).reshape(tokens, h), projection)
        hidden = torch.nn.functional.gelu(torch.nn.functional.linear(out, torch.randn(ffn, h, requires_grad=True)))
        out = out + torch.nn.functional.linear(hidden, torch.randn(h, ffn, requires_grad=True))
    logits = torch.nn.functional.linear(out, torch.randn(vocab, h, requires_grad=True))
    logits.sum().backward()


def test_training_flops_are_the_matmuls_torch_counts_in_forward_and_backward():
    model = {"num_layers": 2, "hidden_size": 16, "ffn_hidden_size": 40}
    lengths = [7, 12]
    counter = FlopCounterMode(display=False)
    with counter:
        for tokens in lengths:
            _plain_training_pass(model, 33, tokens)
    assert training_flops(model, 33, lengths) == counter.get_total_flops()


def test_peak_table_matches_the_most_specific_name():
    assert bf16_dense_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert bf16_dense_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert bf16_dense_peak_tflops("NVIDIA H200") == 989.0
    assert bf16_dense_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert bf16_dense_peak_tflops("Tesla V100-SXM2-16GB") is None


def _timer(spans, seconds, peak_memory_bytes=None):
    return SimpleNamespace(
        spans=spans, seconds=seconds, steps=sum(e - f for f, e in spans), peak_memory_bytes=peak_memory_bytes
    )


class _Items:
    def item_lengths(self, item: int) -> list[int]:
        return [10 + item, 3]


MODEL = {"num_layers": 2, "hidden_size": 16, "ffn_hidden_size": 40}


def test_tokens_flops_and_share_of_peak_of_the_timed_steps():
    timer = _timer([(3, 5), (6, 7)], 2.0, peak_memory_bytes=3 * 2**30)  # steps 3, 4 and 6, 2 items each
    items = [6, 7, 8, 9, 12, 13]
    lengths = [n for k in items for n in (10 + k, 3)]
    speed = training_speed(
        timer, _Items(), 2, MODEL, 33, devices=2, device_name="NVIDIA H100 80GB HBM3", precision="bf16-mixed"
    )
    assert speed["timed_steps"] == 3
    assert speed["train_tokens_per_second"] == pytest.approx(sum(lengths) / 2.0)
    assert speed["model_tflops_per_gpu"] == pytest.approx(training_flops(MODEL, 33, lengths) / 2.0 / 2 / 1e12)
    assert speed["peak_fraction"] == pytest.approx(speed["model_tflops_per_gpu"] / 989.0)
    assert speed["peak_memory_gib"] == 3.0
    rows = dict(speed_rows(speed, "NVIDIA H100 80GB HBM3"))
    assert rows["training speed"].startswith(f"{sum(lengths) / 2.0:,.0f} tokens/s (3 steps in 2.0 s;")
    assert "of the NVIDIA H100 80GB HBM3's 989 bf16 peak" in rows["model FLOP/s"]
    assert rows["peak device memory"] == "3.0 GiB"


def test_no_flops_off_cuda_no_share_of_peak_in_fp32_and_nothing_when_nothing_was_timed():
    cpu = training_speed(_timer([(3, 4)], 1.0), _Items(), 1, MODEL, 33, devices=1, device_name=None, precision="32")
    assert cpu["train_tokens_per_second"] == 16.0
    assert (cpu["model_tflops_per_gpu"], cpu["peak_fraction"]) == (None, None)
    assert [name for name, _ in speed_rows(cpu, None)] == ["training speed"]
    fp32 = training_speed(_timer([(3, 4)], 1.0), _Items(), 1, MODEL, 33, devices=1, device_name="NVIDIA H200",
                          precision="32")  # fmt: skip
    assert fp32["model_tflops_per_gpu"] is not None
    assert fp32["peak_fraction"] is None
    none = training_speed(_timer([], 0.0), _Items(), 1, MODEL, 33, devices=1, device_name=None, precision="32")
    assert none["train_tokens_per_second"] is None
    assert speed_rows(none, None) == []


def test_training_datasets_give_their_items_sequence_lengths():
    records = [SequenceRecord(id=f"s{i}", sequence="MKV" * (i + 1)) for i in range(3)]
    tokenizer = ProteinTokenizer()
    by_count = MaskedProteinDataset(records, tokenizer, length=7)
    assert [by_count.item_lengths(k) for k in range(4)] == [[5], [8], [11], [5]]
    batches = SimpleNamespace(records=lambda item: [2, 0] if item == 0 else [1])
    by_tokens = MaskedTokenBatches(records, tokenizer, batches)
    assert by_tokens.item_lengths(0) == [encoded_length("MKV" * 3), encoded_length("MKV")]
    assert by_tokens.item_lengths(1) == [8]
