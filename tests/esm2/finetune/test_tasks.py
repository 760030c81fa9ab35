"""Labelled CSVs: every label is parsed for its task, every bad input is refused with a message naming it."""

import gzip
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bionemo.esm2.data.readers import InputError
from bionemo.esm2.finetune.tasks import (
    LabelledRecord,
    LabelVocabulary,
    OptionError,
    Task,
    check_label_options,
    read_labelled_csv,
    split,
)


def write(tmp_path: Path, text: str, name: str = "data.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_each_task_parses_its_labels(tmp_path):
    path = write(tmp_path, "id,sequence,Score,b,ss,mask,prof\nx,ACD,1.5,1,HEC,101,0.5 -1 2e1\ny,kl,-2,0,CC,11,3 4\n")
    got = read_labelled_csv(path, Task.REGRESSION, ["score", "b"])
    assert got == [LabelledRecord("x", "ACD", (1.5, 1.0)), LabelledRecord("y", "KL", (-2.0, 0.0))]
    assert [r.labels for r in read_labelled_csv(path, Task.CLASSIFICATION, ["b"])] == [("1",), ("0",)]
    assert [r.labels for r in read_labelled_csv(path, Task.MULTILABEL, ["B"])] == [(1.0,), (0.0,)]
    tokens = read_labelled_csv(path, Task.TOKEN_CLASSIFICATION, ["ss"], mask_column="mask")
    assert [(r.labels, r.mask) for r in tokens] == [("HEC", (True, False, True)), ("CC", (True, True))]
    assert list(tokens[0].scored()) == [0, 2]
    values = read_labelled_csv(path, Task.TOKEN_REGRESSION, ["prof"])
    assert [r.labels for r in values] == [(0.5, -1.0, 20.0), (3.0, 4.0)]
    assert values[0].mask is None
    assert list(values[0].scored()) == [0, 1, 2]


def test_gzipped_csv_and_truncation_cut_the_per_residue_labels(tmp_path):
    path = tmp_path / "data.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("sequence,ss,mask\nACDEF,HHEEC,11001\n")
    (record,) = read_labelled_csv(path, Task.TOKEN_CLASSIFICATION, ["ss"], "mask", max_length=3, truncate=True)
    assert (record.sequence, record.labels, record.mask) == ("ACD", "HHE", (True, True, False))
    with pytest.raises(InputError, match="more than the model's 3"):
        read_labelled_csv(path, Task.TOKEN_CLASSIFICATION, ["ss"], "mask", max_length=3)


BAD_OPTIONS = [
    (Task.REGRESSION, [], None, "--label-column", "needs a label column"),
    (Task.CLASSIFICATION, ["a", "b"], None, "--label-column", "takes one --label-column, got 2: ['a', 'b']"),
    (Task.TOKEN_REGRESSION, ["a", "b"], None, "--label-column", "takes one --label-column"),
    (Task.MULTILABEL, ["a", "A "], None, "--label-column", "given more than once"),
    (Task.REGRESSION, ["Sequence"], None, "--label-column", "is the 'sequence' column"),
    (Task.REGRESSION, ["a"], "m", "--mask-column", "applies to the per-residue tasks"),
    (Task.TOKEN_CLASSIFICATION, ["a"], "a", "--mask-column", "also the sequence, id or a label column"),
]


@pytest.mark.parametrize(("task", "columns", "mask", "option", "message"), BAD_OPTIONS)
def test_options_that_do_not_fit_the_task_name_the_flag(task, columns, mask, option, message):
    with pytest.raises(OptionError, match=message.replace("[", r"\[").replace("]", r"\]")) as error:
        check_label_options(task, columns, mask)
    assert error.value.option == option


# (name, CSV text, task, label columns, mask column, pieces the message must hold)
BAD_FILES = [
    (
        "missing label column",
        "id,sequence,y\na,ACD,1\n",
        Task.REGRESSION,
        ["score"],
        None,
        ["no label column ['score']", "columns found: ['id', 'sequence', 'y']"],
    ),
    (
        "missing mask column",
        "sequence,ss\nACD,HHH\n",
        Task.TOKEN_CLASSIFICATION,
        ["ss"],
        "resolved",
        ["no mask column ['resolved']", "['sequence', 'ss']"],
    ),
    (
        "token label length",
        "id,sequence,ss\na,ACD,HHH\nb,ACDE,HH\n",
        Task.TOKEN_CLASSIFICATION,
        ["ss"],
        None,
        ["data.csv:3: sequence 'b'", "'ss' has 2 label characters but the sequence has 4 residues"],
    ),
    (
        "token regression count",
        "id,sequence,p\na,ACD,1 2\n",
        Task.TOKEN_REGRESSION,
        ["p"],
        None,
        ["data.csv:2: sequence 'a'", "has 2 numbers but the sequence has 3 residues"],
    ),
    (
        "non-numeric regression",
        "id,sequence,y\na,ACD,1\nb,ACD,high\n",
        Task.REGRESSION,
        ["y"],
        None,
        ["data.csv:3: sequence 'b'", "'y' holds 'high', not a finite number"],
    ),
    ("non-finite regression", "sequence,y\nACD,nan\n", Task.REGRESSION, ["y"], None, ["'nan', not a finite number"]),
    (
        "non-numeric token regression",
        "sequence,p\nACD,1 x 2\n",
        Task.TOKEN_REGRESSION,
        ["p"],
        None,
        ["sequence 'row1'", "'p' holds 'x'"],
    ),
    ("empty label", "sequence,y\nACD,\n", Task.CLASSIFICATION, ["y"], None, ["data.csv:2", "'y' is empty"]),
    (
        "multilabel not 0/1",
        "sequence,a,b\nACD,1,0\nACD,0,yes\n",
        Task.MULTILABEL,
        ["a", "b"],
        None,
        ["data.csv:3", "multilabel column 'b' holds 'yes'; give 0 or 1"],
    ),
    (
        "mask not 0/1",
        "id,sequence,ss,m\nq,ACD,HHE,1x1\n",
        Task.TOKEN_CLASSIFICATION,
        ["ss"],
        "m",
        ["sequence 'q'", "mask column 'm' holds ['x']"],
    ),
    (
        "mask length",
        "id,sequence,ss,m\nq,ACD,HHE,11\n",
        Task.TOKEN_CLASSIFICATION,
        ["ss"],
        "m",
        ["sequence 'q'", "'m' has 2 mask characters but the sequence has 3 residues"],
    ),
    ("empty file", "", Task.REGRESSION, ["y"], None, ["is empty", "(sequence, y)"]),
    ("header only", "sequence,y\n", Task.REGRESSION, ["y"], None, ["holds no sequences"]),
    ("bad sequence", "sequence,y\nAC1,1\n", Task.REGRESSION, ["y"], None, ["outside the amino-acid alphabet"]),
]


@pytest.mark.parametrize(("text", "task", "columns", "mask", "pieces"), [c[1:] for c in BAD_FILES],
                         ids=[c[0] for c in BAD_FILES])  # fmt: skip
def test_bad_files_are_refused_naming_row_column_and_value(tmp_path, text, task, columns, mask, pieces):
    path = write(tmp_path, text)
    with pytest.raises(InputError) as error:
        read_labelled_csv(path, task, columns, mask)
    for piece in pieces:
        assert piece in str(error.value)


def test_fasta_is_refused_it_cannot_carry_labels(tmp_path):
    path = write(tmp_path, ">a\nACD\n", "seqs.fasta.gz")
    with pytest.raises(InputError, match=r"is FASTA, which cannot carry labels.*\['y'\]"):
        read_labelled_csv(path, Task.REGRESSION, ["y"])


def records_of(labels: list[str]) -> list[LabelledRecord]:
    return [LabelledRecord(f"s{i}", "ACD", (label,)) for i, label in enumerate(labels)]


def test_vocabulary_sorts_classes_encodes_and_round_trips_json():
    records = records_of(["nucleus", "cytoplasm", "nucleus", "membrane"])
    vocab = LabelVocabulary.from_records(Task.CLASSIFICATION, ["loc"], records)
    assert vocab.classes == ("cytoplasm", "membrane", "nucleus")
    assert (vocab.outputs, vocab.num_outputs) == (vocab.classes, 3)
    assert [vocab.encode(r) for r in records] == [(2,), (0,), (2,), (1,)]
    assert LabelVocabulary.from_json(vocab.to_json()) == vocab
    regression = LabelVocabulary(task=Task.REGRESSION, columns=("a", "b"))
    assert (regression.outputs, regression.num_outputs) == (("a", "b"), 2)
    assert regression.encode(LabelledRecord("x", "A", (1.5, 2.0))) == (1.5, 2.0)


def test_token_vocabulary_counts_scored_residues_only():
    records = [
        LabelledRecord("a", "ACDE", "HE-C", (True, True, False, True)),
        LabelledRecord("b", "AC", "EE"),
    ]
    vocab = LabelVocabulary.from_records(Task.TOKEN_CLASSIFICATION, ["ss"], records)
    assert vocab.classes == ("C", "E", "H")  # '-' is on an unscored residue only
    assert vocab.encode(records[0]) == (2, 1, 0, 0)
    vocab.check_unseen([LabelledRecord("v", "AC", "X-", (False, False))])  # unscored: not checked
    with pytest.raises(InputError, match=r"sequence 'w' has label\(s\) \['X'\].*\['C', 'E', 'H'\]"):
        vocab.check_unseen([LabelledRecord("w", "AC", "XH")], Path("val.csv"))


def test_one_class_only_and_unseen_validation_labels_are_refused():
    with pytest.raises(InputError, match=r"train.csv: the training labels \('loc'\) hold one class only, \['x'\]"):
        LabelVocabulary.from_records(Task.CLASSIFICATION, ["loc"], records_of(["x", "x"]), Path("train.csv"))
    with pytest.raises(InputError, match="one class only"):
        LabelVocabulary.from_records(Task.TOKEN_CLASSIFICATION, ["ss"], [LabelledRecord("a", "AC", "HH")])
    constant = [LabelledRecord("a", "A", (1.0, 0.0)), LabelledRecord("b", "A", (1.0, 1.0))]
    with pytest.raises(InputError, match="multilabel column 'p' is 1 in every training row"):
        LabelVocabulary.from_records(Task.MULTILABEL, ["p", "q"], constant)
    vocab = LabelVocabulary.from_records(Task.CLASSIFICATION, ["loc"], records_of(["a", "b"]))
    vocab.check_unseen(records_of(["b", "a"]))
    with pytest.raises(InputError, match=r"val.csv: sequence 's1' has label\(s\) \['c'\].*\['a', 'b'\]"):
        vocab.check_unseen(records_of(["a", "c"]), Path("val.csv"))


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.sampled_from("abc"), min_size=2, max_size=40),
    fraction=st.floats(0.05, 0.95),
    seed=st.integers(0, 2**32),
    stratify=st.booleans(),
)
def test_split_is_seeded_disjoint_and_covers_every_record(labels, fraction, seed, stratify):
    records = records_of(labels)
    task = Task.CLASSIFICATION if stratify else None
    if stratify and all(labels.count(c) < 2 for c in set(labels)):
        with pytest.raises(InputError, match="every class has one sequence only"):
            split(records, fraction, seed, task=task)
        return
    train, val = split(records, fraction, seed, task=task)
    assert (train, val) == split(records, fraction, seed, task=task)
    ids_train, ids_val = [r.id for r in train], [r.id for r in val]
    assert not set(ids_train) & set(ids_val)
    assert sorted(ids_train + ids_val) == sorted(r.id for r in records)
    order = [r.id for r in records]
    assert ids_train == [i for i in order if i in ids_train]  # input order kept
    assert ids_val == [i for i in order if i in ids_val]
    assert train
    assert val
    if stratify:  # no class in validation that training lacks; each class holds out about its share
        assert {r.labels for r in val} <= {r.labels for r in train}
        for name in set(labels):
            n = labels.count(name)
            held = sum(r.labels == (name,) for r in val)
            assert held == min(n - 1, round(fraction * n)) or (held == 1 and len(val) == 1)
    else:
        assert len(val) == min(len(records) - 1, max(1, round(fraction * len(records))))


def test_split_seed_changes_the_split_and_fraction_is_checked():
    records = records_of(list("ab" * 20))
    splits = {tuple(r.id for r in split(records, 0.25, seed)[1]) for seed in range(5)}
    assert len(splits) > 1
    with pytest.raises(ValueError, match="strictly between 0 and 1, got 1.0"):
        split(records, 1.0, 0)
    with pytest.raises(InputError, match="1 labelled sequence"):
        split(records[:1], 0.5, 0)


def test_tasks_and_head_choices_import_no_torch():
    code = "import sys, bionemo.esm2.finetune; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
