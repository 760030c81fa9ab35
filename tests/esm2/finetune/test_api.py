"""The Python API of fine-tuning: labels as Python values, the CLI's run, checks and files underneath.

The base is a tiny random Hugging Face ESM-2 built here; the task (tests/support/finetune_data.py) is learnable from
residue identity. The model trained in memory is compared with ``bionemo run predict`` on the same file.
"""

import logging
import math
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

from bionemo.core.import_notes import IMPORT_WARNINGS
from bionemo.core.megatron_env import prepare_megatron_import
from bionemo.esm2.data.readers import InputError
from bionemo.esm2.finetune.api import FinetunedModel, _write_labelled, finetune
from bionemo.esm2.finetune.tasks import Task, read_labelled_csv
from bionemo.recipes.outputs import read_predictions
from bionemo.recipes.settings import SettingsError
from support.cli_runs import bionemo
from support.finetune_data import read_csv, rows, write_csv


def _pairs(table: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(r["id"], r["sequence"]) for r in table]


def test_finetune_in_memory_then_predict_as_the_cli_does(base, tmp_path):
    train, val, test = rows(96, seed=1), rows(16, seed=2), rows(48, seed=3)
    model = finetune(
        base, _pairs(train), [r["kind"] for r in train], task="classification", label_columns=["kind"],
        val_sequences=[r["sequence"] for r in val], val_labels=[r["kind"] for r in val],
        max_steps=16, val_check_interval=8, lr=1e-3, accelerator="cpu",
    )  # fmt: skip
    assert (model.spec.task, model.spec.labels.classes, model.spec.labels.columns) == (
        "classification", ("hyd", "pol"), ("kind",)
    )  # fmt: skip
    assert model.metrics["steps"] == 16
    assert model.metrics["best"]["metric"] == "val_mcc"
    assert model.path.name == "model.safetensors"
    assert model.path.is_file()

    predicted = model.predict(_pairs(test), accelerator="cpu")
    assert predicted.ids == [r["id"] for r in test]
    accuracy = sum(p == r["kind"] for p, r in zip(predicted.labels, test, strict=True)) / len(test)
    assert accuracy >= 0.9, accuracy
    assert predicted.names == ("hyd", "pol")
    assert predicted.outputs.shape == (len(test), 2)
    assert predicted.labels == [predicted.names[i] for i in predicted.outputs.argmax(dim=1).tolist()]

    # the same model file through `bionemo run predict`: the same labels and probabilities
    saved = model.save(tmp_path / "kept" / "model.safetensors")
    cli = tmp_path / "cli"
    bionemo("run", "predict", "--checkpoint", str(saved.path), "--data", str(write_csv(tmp_path / "test.csv", 48, 3)),
            "--output-dir", str(cli), "--accelerator", "cpu", cwd=tmp_path)  # fmt: skip
    assert [r["kind"] for r in read_csv(cli / "predictions.csv")] == predicted.labels
    ids, tensors = read_predictions(cli / "predictions.safetensors")
    assert ids == predicted.ids
    torch.testing.assert_close(tensors["probabilities"], predicted.outputs, rtol=0, atol=0)

    loaded = FinetunedModel.load(saved.path)
    assert (loaded.spec, loaded.metrics) == (model.spec, model.metrics)
    validation = loaded.predict([r["sequence"] for r in val], accelerator="cpu")
    assert validation.ids == [f"row{i + 1}" for i in range(len(val))]  # as a CSV without an id column
    best = model.metrics["best"]
    assert math.isclose(_mcc(validation.labels, [r["kind"] for r in val]), best["value"], abs_tol=1e-5)


def _mcc(predicted: list[str], truth: list[str]) -> float:
    pairs = list(zip(predicted, truth, strict=True))
    tp, tn = sum(p == t == "hyd" for p, t in pairs), sum(p == t == "pol" for p, t in pairs)
    fp, fn = sum(p == "hyd" != t for p, t in pairs), sum(p == "pol" != t for p, t in pairs)
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / denominator if denominator else 0.0


def test_a_token_task_predicts_one_label_per_residue(base):
    train, test = rows(24, seed=6), rows(4, seed=7)
    model = finetune(
        base, [r["sequence"] for r in train], [r["ss"] for r in train], task="token-classification",
        masks=[r["resolved"] for r in train], encoder="frozen", max_steps=2, accelerator="cpu",
    )  # fmt: skip
    assert (model.spec.labels.columns, model.spec.labels.classes) == (("label",), ("C", "H"))
    predicted = model.predict([r["sequence"] for r in test], accelerator="cpu")
    assert [len(label) for label in predicted.labels] == [len(r["sequence"]) for r in test]
    assert [p.shape for p in predicted.outputs] == [(len(r["sequence"]), 2) for r in test]
    decoded = ["".join(predicted.names[i] for i in p.argmax(dim=1).tolist()) for p in predicted.outputs]
    assert predicted.labels == decoded


_PYTHON_LABELS = {
    Task.REGRESSION: (["score"], lambda r: float(r["score"])),
    Task.CLASSIFICATION: (["kind"], lambda r: r["kind"]),
    Task.MULTILABEL: (["has_c", "has_w"], lambda r: (r["has_c"] == "1", int(r["has_w"]))),  # booleans or 0/1
    Task.TOKEN_CLASSIFICATION: (["ss"], lambda r: r["ss"]),
    Task.TOKEN_REGRESSION: (["hydro"], lambda r: [float(v) for v in r["hydro"].split()]),
}


@pytest.mark.parametrize("task", list(Task))
def test_python_labels_give_the_records_of_the_cli_csv(task, tmp_path):
    """Labels given as Python values are read as the same CSV's cells are (masks as booleans or 0/1 strings)."""
    table = rows(12, seed=4)
    columns, label = _PYTHON_LABELS[task]
    mask = "resolved" if task.per_residue else None
    masks = [[c == "1" for c in r["resolved"]] for r in table] if mask else None
    written = _write_labelled(tmp_path / "api.csv", task, columns, _pairs(table), [label(r) for r in table],
                              masks, "sequences")  # fmt: skip
    got = read_labelled_csv(written, task, columns, "mask" if mask else None)
    expected = read_labelled_csv(write_csv(tmp_path / "cli.csv", 12, seed=4), task, columns, mask)
    assert got == expected


def test_regression_of_several_columns_takes_tuples(tmp_path):
    table = rows(4, seed=5)
    values = [(float(r["score"]), 0.1 * i) for i, r in enumerate(table)]
    written = _write_labelled(tmp_path / "a.csv", Task.REGRESSION, ["score", "index"], _pairs(table), values, None,
                              "sequences")  # fmt: skip
    assert [r.labels for r in read_labelled_csv(written, Task.REGRESSION, ["score", "index"])] == values


def _refused(base: Path, error: type[Exception], **changes) -> str:
    train = rows(24, seed=1)
    arguments = {
        "sequences": [r["sequence"] for r in train],
        "labels": [r["kind"] for r in train],
        "task": "classification",
        "accelerator": "cpu",
        **changes,
    }
    with pytest.raises(error) as caught:
        finetune(base, **arguments)
    return str(caught.value)


def test_bad_input_is_refused_with_the_clis_messages_naming_the_arguments(base, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the API's temporary folders go
    train = rows(24, seed=1)
    sequences = [r["sequence"] for r in train]
    bad = [*sequences[:3], "MKT-AYI", *sequences[4:]]
    message = _refused(base, SettingsError, sequences=bad)
    assert message.startswith("sequences: sequence 'row4' has a gap '-' at residue 4"), message
    assert "/tmp" not in message
    assert ".csv" not in message

    message = _refused(base, SettingsError, labels=[*[r["kind"] for r in train[:-1]], ""])
    assert message == "sequences[23]: sequence 'row24': label column 'label' is empty"

    message = _refused(base, SettingsError, labels=["hyd"] * len(train))
    assert (
        message
        == "sequences: the training labels ('label') hold one class only, ['hyd']; classification needs at least 2"
    )

    message = _refused(base, SettingsError, val_sequences=sequences[:2], val_labels=["hyd", "other"])
    assert message.startswith("val_sequences: sequence 'row2' has label(s) ['other']"), message

    message = _refused(base, SettingsError, task="multilabel", labels=[(0, 1)] * len(train))
    assert message == "--task multilabel needs a label column; give --label-column NAME"

    labels = [(int(r["has_c"]), 0.5) for r in train]
    message = _refused(base, SettingsError, task="multilabel", labels=labels, label_columns=["c", "w"])
    assert message == "sequences[0]: sequence 'row1': multilabel column 'w' holds '0.5'; give 0 or 1"

    assert _refused(base, SettingsError, task="ranking").startswith("--task 'ranking': valid are regression, ")
    assert _refused(base, SettingsError, lr=-1.0).startswith("setting 'lr': Input should be greater than 0")
    assert _refused(base, ValueError, labels=["hyd"]) == "labels: give one label per sequence; got 1 for 24 sequences"
    message = _refused(base, ValueError, task="regression", labels=[(1.0, 2.0)] * 24, label_columns=["a"])
    assert message == "labels[0] is (1.0, 2.0), 2 value(s); give 1, one per label column"
    assert "(id, sequence) pair" in _refused(base, TypeError, sequences=[*sequences[:-1], 7])
    assert _refused(base, TypeError, sequences="MKTAYIAK").startswith("sequences: give a list of sequences")

    with pytest.raises(SettingsError, match="is a pretrained model without a task head"):
        FinetunedModel.load(base)
    assert not list(tmp_path.iterdir())  # every refused run removed its temporary folders
    assert issubclass(SettingsError, ValueError)
    assert issubclass(InputError, ValueError)


def test_output_dir_resumes_its_own_run_and_refuses_another(base, tmp_path):
    """The API's data goes through a new temporary CSV on every call: a run is its records, not the file's path."""
    train = rows(48, seed=1)
    sequences, kinds = _pairs(train), [r["kind"] for r in train]
    common = {"task": "classification", "label_columns": ["kind"], "accelerator": "cpu", "output_dir": tmp_path / "run"}
    assert finetune(base, sequences, kinds, max_steps=3, **common).metrics["steps"] == 3
    assert finetune(base, sequences, kinds, max_steps=5, **common).metrics["steps"] == 5  # resumed, not refused
    flipped = [{"hyd": "pol", "pol": "hyd"}[kind] for kind in kinds]
    with pytest.raises(SettingsError, match=r"holds the checkpoints of another run .* data\.train\.sha256"):
        finetune(base, sequences, flipped, max_steps=3, **common)
    assert finetune(base, sequences, flipped, max_steps=3, resume=False, **common).metrics["steps"] == 3


_LOGGERS = ("megatron", "lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


@pytest.fixture
def loud_process():
    """A process where nothing quiets the libraries yet (earlier tests in it may have run ``bionemo run``)."""
    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    prepare_megatron_import()  # what every bionemo package does first: megatron's import notes hidden for good
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def _process_state() -> tuple:
    """Warning filters (but megatron's import notes', which bionemo hides for good), logger levels and filters."""
    notes = {message for message, _ in IMPORT_WARNINGS}
    filters = [f for f in warnings.filters if f[1] is None or f[1].pattern not in notes]
    levels = [logging.getLogger(name).level for name in _LOGGERS]
    return filters, warnings.showwarning, levels, list(logging.getLogger("nemo_logger").filters)


@pytest.mark.usefixtures("loud_process")
def test_the_libraries_chatter_is_hidden_during_a_call_and_verbose_shows_it(base, caplog):
    train = rows(32, seed=4)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        before = _process_state()
        model = finetune(base, [r["sequence"] for r in train], [r["kind"] for r in train], task="classification",
                         max_steps=2, val_check_interval=1, accelerator="cpu")  # fmt: skip
        model.predict([r["sequence"] for r in train[:4]], accelerator="cpu")
        assert _process_state() == before  # the caller's warning filters and loggers, as they were
        quiet = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
        assert [line for line in quiet if "sync_dist" in line or "GPU available" in line] == []

        caught.clear()
        caplog.clear()
        model.predict([r["sequence"] for r in train[:4]], accelerator="cpu", verbose=True)
        assert any("GPU available" in r.getMessage() for r in caplog.records)  # Lightning's lines, let through
        assert _process_state() == before
