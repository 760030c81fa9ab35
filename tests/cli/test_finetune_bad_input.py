"""``bionemo run finetune`` refuses bad input with exit code 2 and a message naming it, and writes nothing.

Each case runs the app in-process (typer's ``CliRunner``) in an empty folder with an ``--output-dir`` that must not
exist afterwards; the folder must stay empty. That the checks run before torch is imported, and how fast they
answer, is measured by tools/bench_input_errors.py.
"""

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bionemo.cli.app import app
from support.cli_runs import bionemo
from support.hf_esm import random_hf_esm, random_sequences

runner = CliRunner()

ROWS = 20
SEQUENCES = random_sequences(ROWS, seed=3, low=8, high=24)
LONGEST = max(len(s) for s in SEQUENCES) + 2
"""Tokens of the longest sequence (``<cls>`` and ``<eos>`` included)."""
LENGTH_ROW, NUMBER_ROW = 2, 4
"""The rows (0-based, after the header) that bad_length.csv and bad_number.csv spoil."""


def _csv(path: Path, *, kinds: list[str] | None = None, rows: int = ROWS, spoil: str | None = None) -> Path:
    """A labelled CSV (id, sequence, kind, score, ss) over :data:`SEQUENCES`; ``spoil``: 'length' or 'number'."""
    kinds = kinds or ["a", "b"]
    lines = ["id,sequence,kind,score,ss"]
    for i, sequence in enumerate(SEQUENCES[:rows]):
        score, ss = str(i / rows), "HC" * len(sequence)
        ss = ss[: len(sequence) - 2] if spoil == "length" and i == LENGTH_ROW else ss[: len(sequence)]
        score = "high" if spoil == "number" and i == NUMBER_ROW else score
        lines.append(f"s{i},{sequence},{kinds[i % len(kinds)]},{score},{ss}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _safetensors(path: Path) -> Path:
    """A one-tensor safetensors file without bionemo's metadata."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "__metadata__": {"format": "pt"}})
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(4))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A random ESM-2 base, a model fine-tuned from it for 2 steps, good and bad CSVs, non-ESM-2 checkpoints."""
    tmp = tmp_path_factory.mktemp("finetune_inputs")
    random_hf_esm(tmp / "base", hidden=32, heads=4, layers=2, ffn=48)
    made = {
        "base": tmp / "base",
        "train": _csv(tmp / "train.csv"),
        "bad_length": _csv(tmp / "bad_length.csv", spoil="length"),
        "bad_number": _csv(tmp / "bad_number.csv", spoil="number"),
        "one_class": _csv(tmp / "one_class.csv", kinds=["a"]),
        "val_unseen": _csv(tmp / "val_unseen.csv", kinds=["a", "b", "c"], rows=4),
        "empty": tmp / "empty.csv",
        "fasta": tmp / "seqs.fasta",
        "bert": tmp / "bert",
        "random": _safetensors(tmp / "random.safetensors"),
    }
    made["empty"].write_text("")
    made["fasta"].write_text(">a\nMKVLA\n>b\nMKKLV\n")
    made["bert"].mkdir()
    (made["bert"] / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    finetuned = tmp / "finetuned"
    bionemo(
        *("run", "finetune", "--checkpoint", str(made["base"]), "--data", str(made["train"])),
        *("--task", "classification", "--label-column", "kind", "--output-dir", str(finetuned), "--max-steps", "2"),
        cwd=tmp,
    )
    made["finetuned"] = finetuned / "model.safetensors"
    return made


def _length(row: int) -> int:
    return len(SEQUENCES[row])


Case = tuple[Callable[[dict[str, Path]], list[str]], str, list[str]]
CLASSIFY = ["--task", "classification", "--label-column", "kind"]


def _on(data: str, *args: str, checkpoint: str = "base") -> Callable[[dict[str, Path]], list[str]]:
    """Arguments: ``--checkpoint files[checkpoint] --data files[data]`` then ``args`` (a name in braces: a file)."""

    def build(f: dict[str, Path]) -> list[str]:
        words = ["--checkpoint", str(f[checkpoint])] if checkpoint else []
        words += ["--data", str(f[data])] if data else []
        return words + [str(f[a[1:-1]]) if a.startswith("{") else a for a in args]

    return build


CASES: dict[str, Case] = {
    "missing label column": (
        _on("train", "--task", "classification", "--label-column", "nope"),
        "--data",
        ["no label column ['nope']", "the columns found: ['id', 'sequence', 'kind', 'score', 'ss']"],
    ),
    "token labels of another length": (
        _on("bad_length", "--task", "token-classification", "--label-column", "ss"),
        "--data",
        [
            f"bad_length.csv:{LENGTH_ROW + 2}: sequence 's{LENGTH_ROW}'",
            f"'ss' has {_length(LENGTH_ROW) - 2} label characters but the sequence has {_length(LENGTH_ROW)} residues",
        ],
    ),
    "non-numeric regression label": (
        _on("bad_number", "--task", "regression", "--label-column", "score"),
        "--data",
        [f"bad_number.csv:{NUMBER_ROW + 2}: sequence 's{NUMBER_ROW}'", "'score' holds 'high', not a finite number"],
    ),
    "one class only": (
        _on("one_class", *CLASSIFY),
        "--data",
        ["the training labels ('kind') hold one class only, ['a']", "needs at least 2"],
    ),
    "validation label unseen in training": (
        _on("train", *CLASSIFY, "--val-data", "{val_unseen}"),
        "--val-data",
        ["sequence 's2' has label(s) ['c']", "training classes: ['a', 'b']"],
    ),
    "unknown task": (
        _on("train", "--task", "nope", "--label-column", "kind"),
        "--task",
        ["'nope' is not one of 'regression', 'classification', 'multilabel', 'token-classification'"],
    ),
    "unknown head": (_on("train", *CLASSIFY, "--head", "nope"), "--head", ["'nope' is not one of 'hf', 'mlp', 'conv'"]),
    "hf head for token regression": (
        _on("train", "--task", "token-regression", "--label-column", "ss", "--head", "hf"),
        "--head",
        ["--head hf cannot do --task token-regression", "valid for token-regression: conv"],
    ),
    "LoRA option without --encoder lora": (
        _on("train", *CLASSIFY, "--lora-rank", "4"),
        "--encoder",
        ["--lora-rank applies to --encoder lora only (got --encoder full)", "add --encoder lora"],
    ),
    "BERT folder as base": (
        _on("train", *CLASSIFY, checkpoint="bert"),
        "--checkpoint",
        ["has model_type 'bert'", "only ESM-2 models (model_type 'esm', EsmForMaskedLM)"],
    ),
    "safetensors without bionemo metadata": (
        _on("train", *CLASSIFY, checkpoint="random"),
        "--checkpoint",
        ["random.safetensors has no model config in its metadata"],
    ),
    "empty CSV": (_on("empty", *CLASSIFY), "--data", ["empty.csv is empty", "give a CSV with a header"]),
    "FASTA as data": (
        _on("fasta", *CLASSIFY),
        "--data",
        ["seqs.fasta is FASTA, which cannot carry labels", "give a CSV"],
    ),
    "no checkpoint": (
        _on("train", *CLASSIFY, checkpoint=""),
        "--checkpoint",
        ["starts from a pretrained model: give --checkpoint"],
    ),
    "no task": (
        _on("train", "--label-column", "kind"),
        "--task",
        ["fine-tuning needs --task; valid: regression, classification, multilabel, token-classification"],
    ),
    "no data": (_on("", *CLASSIFY), "--data", ["fine-tuning needs labelled data: give --data"]),
    "pipeline parallelism": (
        _on("train", *CLASSIFY, "--pipeline-parallel", "2"),
        "--pipeline-parallel",
        ["leave --pipeline-parallel and --context-parallel at 1"],
    ),
    "fine-tuned model as base": (
        _on("train", *CLASSIFY, checkpoint="finetuned"),
        "--checkpoint",
        ["model.safetensors is a fine-tuned model", "starts from a pretrained ESM-2"],
    ),
    "unknown LoRA target": (
        _on("train", *CLASSIFY, "--encoder", "lora", "--lora-targets", "nope"),
        "--lora-targets",
        ["--lora-targets ['nope']: valid are qkv, proj, fc1, fc2"],
    ),
    "global batch tokens and a batch size by count": (
        _on("train", *CLASSIFY, "--global-batch-tokens", "4096", "--global-batch-size", "4"),
        "--global-batch-tokens",
        ["--global-batch-tokens cuts batches by tokens, --global-batch-size by count: give one or the other"],
    ),
    "global batch tokens below two of the longest sequences": (
        _on("train", *CLASSIFY, "--global-batch-tokens", "10"),
        "--global-batch-tokens",
        [
            f"two of the longest sequences ({LONGEST} tokens with <cls> and <eos>): give at least {2 * LONGEST}",
        ],
    ),
    "mask column for a sequence task": (
        _on("train", *CLASSIFY, "--mask-column", "ss"),
        "--mask-column",
        ["--mask-column applies to the per-residue tasks (token-classification, token-regression)"],
    ),
}


def _flat(output: str) -> str:
    for border in "│╭╮╰╯─":
        output = output.replace(border, " ")
    return " ".join(output.split())


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_message_and_writes_nothing(case, files, tmp_path, monkeypatch):
    build, option, fragments = CASES[case]
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    args = ["run", "finetune", *build(files), "--output-dir", str(out), "--max-steps", "2"]
    result = runner.invoke(app, args, terminal_width=400, env={"COLUMNS": "400"})
    text = _flat(result.output)
    assert result.exit_code == 2, text + repr(result.exception)
    assert f"Invalid value for '{option}'" in text, text
    for fragment in fragments:
        assert fragment in text, text
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
