"""``bionemo run predict --checkpoint HF_DIR`` of Hugging Face ``EsmFor{Sequence,Token}Classification`` folders.

What users fine-tuned with transformers predicts here as there: transformers' probabilities (fp32, 1e-4), the
classes named by ``config.id2label`` (``predictions.csv`` and the ``labels`` metadata), in input order.
"""

import json

import torch
from safetensors import safe_open

from bionemo.recipes.outputs import read_predictions, split_residues
from support.cli_runs import bionemo
from support.finetune_data import read_csv
from support.hf_esm import random_sequences
from support.hf_finetuned import hf_logits, random_hf_classifier

LABELS = {0: "cytoplasm", 1: "membrane", 2: "nucleus"}


def _predict(folder, sequences):
    """``bionemo run predict`` of ``sequences`` (ids q0, q1, ...) with ``folder/hf``; the output folder."""
    fasta = folder / "q.fasta"
    fasta.write_text("".join(f">q{i}\n{s}\n" for i, s in enumerate(sequences)))
    out = folder / "pred"
    bionemo("run", "predict", "--checkpoint", str(folder / "hf"), "--data", str(fasta), "--output-dir", str(out),
            "--accelerator", "cpu", cwd=folder)  # fmt: skip
    return out


def test_sequence_classifier_predicts_transformers_probabilities(tmp_path):
    model = random_hf_classifier(tmp_path / "base", tmp_path / "hf", num_labels=3, id2label=LABELS)
    sequences = random_sequences(9, seed=4)
    out = _predict(tmp_path, sequences)
    logits, _ = hf_logits(model, sequences)
    expected = logits.float().softmax(dim=-1)
    ids, tensors = read_predictions(out / "predictions.safetensors")
    assert ids == [f"q{i}" for i in range(len(sequences))]
    torch.testing.assert_close(tensors["probabilities"], expected, atol=1e-4, rtol=0)
    with safe_open(str(out / "predictions.safetensors"), framework="pt") as f:
        assert json.loads(f.metadata()["labels"]) == list(LABELS.values())
    table = read_csv(out / "predictions.csv")
    assert [row["label"] for row in table] == [LABELS[int(i)] for i in expected.argmax(dim=-1)]


def test_token_classifier_predicts_transformers_probabilities_per_residue(tmp_path):
    names = {0: "H", 1: "E", 2: "C"}
    model = random_hf_classifier(tmp_path / "base", tmp_path / "hf", token=True, num_labels=3, id2label=names)
    sequences = random_sequences(7, seed=5)
    out = _predict(tmp_path, sequences)
    logits, _ = hf_logits(model, sequences)
    _, tensors = read_predictions(out / "predictions.safetensors")
    per_residue = split_residues(tensors, "probabilities")
    table = read_csv(out / "predictions.csv")
    for i, sequence in enumerate(sequences):
        expected = logits[i, 1 : len(sequence) + 1].float().softmax(dim=-1)
        torch.testing.assert_close(per_residue[i], expected, atol=1e-4, rtol=0)
        assert table[i]["label"] == "".join(names[int(k)] for k in expected.argmax(dim=-1))
