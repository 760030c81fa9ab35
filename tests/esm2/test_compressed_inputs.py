"""Gzipped FASTA / CSV are read with the plain files' checks; broken gzip and Parquet are refused by name."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bionemo.esm2.data.readers import (
    CSV_SUFFIXES,
    DATA_FORMATS,
    FASTA_SUFFIXES,
    InputError,
    SequenceRecord,
    lowercase_note,
    read_sequences,
)

FASTA = ">a first\nMKVLA\nQQR*\n>b\nacdEF\n>c\nWWY\n"
CSV = "id,sequence\na,MKVLAQQR\nb,acdEF\nc,WWY\n"
EXPECTED = [
    SequenceRecord("a", "MKVLAQQR"),
    SequenceRecord("b", "ACDEF", lowercase=True),
    SequenceRecord("c", "WWY"),
]


def _gzip(path: Path, text: str) -> Path:
    with gzip.open(path, "wt") as f:
        f.write(text)
    return path


@pytest.mark.parametrize("suffix", [*FASTA_SUFFIXES, *(s.upper() for s in FASTA_SUFFIXES), *CSV_SUFFIXES])
def test_gzipped_files_read_as_the_plain_ones(tmp_path, suffix):
    text = CSV if suffix.lower() in CSV_SUFFIXES else FASTA
    plain = tmp_path / f"plain{suffix}"
    plain.write_text(text)
    zipped = _gzip(tmp_path / f"zipped{suffix}.gz", text)
    assert read_sequences(plain) == read_sequences(zipped) == EXPECTED
    assert read_sequences(zipped, max_length=4, truncate=True)[0] == SequenceRecord("a", "MKVL", truncated_from=8)


def test_gzipped_files_get_the_same_checks_with_the_file_named(tmp_path):
    cases = {
        "gap.fasta.gz": (">a\nMK-V\n", "has a gap '-' at residue 3"),
        "bad.fasta.gz": (">a\nMKV1\n", "characters ['1'] outside the amino-acid alphabet"),
        "dup.fasta.gz": (">a\nMK\n>a\nMV\n", "appears more than once"),
        "nohead.fasta.gz": ("MKV\n", "before the first '>' header"),
        "empty.fasta.gz": ("", "holds no sequences"),
        "noseq.csv.gz": ("id,seq\na,MKV\n", "'sequence' column"),
        "long.fasta.gz": (">a\nMKVLAQ\n", "pass --truncate"),
    }
    for name, (text, message) in cases.items():
        path = _gzip(tmp_path / name, text)
        with pytest.raises(InputError) as error:
            read_sequences(path, max_length=5)
        assert message in str(error.value), name
        assert str(path) in str(error.value), name


def _broken(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    whole = gzip.compress((FASTA * 200).encode())
    damaged = bytearray(whole)
    damaged[40:60] = bytes(b ^ 0xFF for b in damaged[40:60])
    crc = whole[:-8] + bytes(8)
    files = {
        "truncated": (whole[: len(whole) // 2], "ends before its gzip stream does"),
        "not gzip": (FASTA.encode(), "is not gzip-compressed although its name ends in .gz"),
        "damaged": (bytes(damaged), "is a damaged gzip file"),
        "bad checksum": (crc, "is a damaged gzip file (CRC check failed"),
    }
    out = {}
    for name, (data, message) in files.items():
        path = tmp_path / f"{name.replace(' ', '_')}.fasta.gz"
        path.write_bytes(data)
        out[name] = (path, message)
    return out


def test_broken_gzip_is_an_input_error_naming_the_file(tmp_path):
    for name, (path, message) in _broken(tmp_path).items():
        with pytest.raises(InputError) as error:
            read_sequences(path)
        assert message in str(error.value), name
        assert str(path) in str(error.value), name


def test_parquet_and_unknown_extensions_are_refused_listing_every_valid_one(tmp_path):
    valid = [*FASTA_SUFFIXES, *CSV_SUFFIXES]
    for name, message in {
        "s.parquet": "is Parquet, which bionemo does not read",
        "s.PARQUET": "is Parquet",
        "s.txt": "has extension '.txt'",
        "s.tsv.gz": "has extension '.tsv.gz'",
        "s.fasta.bz2": "has extension '.bz2'",
        "s": "has no extension",
    }.items():
        path = tmp_path / name
        path.write_text(FASTA)
        with pytest.raises(InputError) as error:
            read_sequences(path)
        text = str(error.value)
        assert message in text, name
        assert all(s in text for s in valid), text
        assert all(f"{s}.gz" in text for s in valid), text
    with pytest.raises(InputError, match=r"pandas\.read_parquet\('.*s\.parquet'\)\.to_csv\('sequences\.csv'"):
        read_sequences(tmp_path / "s.parquet")


def test_data_help_lists_what_the_reader_reads():
    from typer.testing import CliRunner

    from bionemo.cli.app import app

    assert all(s in DATA_FORMATS for s in (*FASTA_SUFFIXES, *CSV_SUFFIXES, ".gz"))
    for command in ("predict", "train"):
        result = CliRunner().invoke(app, ["run", command, "--help"], env={"COLUMNS": "2000"})
        assert result.exit_code == 0
        text = " ".join(result.output.replace("│", " ").split())
        assert DATA_FORMATS in text, text


def test_lowercase_note_counts_the_sequences_read_as_uppercase():
    records = [SequenceRecord("a", "MKV"), SequenceRecord("b", "ACD", lowercase=True)]
    assert lowercase_note(records[:1]) is None
    assert lowercase_note(records) == "1 sequence had lowercase letters, read as uppercase"
    assert lowercase_note(records + records[1:]) == "2 sequences had lowercase letters, read as uppercase"


WRAPPER = """
import atexit, json, runpy, sys
heavy = ("torch", "lightning", "nemo", "megatron", "transformers")
atexit.register(lambda: print("HEAVY=" + json.dumps([m for m in heavy if m in sys.modules]), file=sys.stderr))
sys.argv = ["bionemo", *sys.argv[1:]]
runpy.run_module("bionemo.cli", run_name="__main__")
"""


def test_cli_refuses_broken_gzip_and_parquet_before_importing_torch(tmp_path):
    parquet = tmp_path / "s.parquet"
    parquet.write_bytes(b"PAR1")
    broken = _broken(tmp_path)
    for path, message in (broken["truncated"], broken["not gzip"], (parquet, "is Parquet")):
        out = tmp_path / "out"
        result = subprocess.run(
            [sys.executable, "-c", WRAPPER, "run", "predict", "--data", str(path), "--output-dir", str(out)],
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "COLUMNS": "2000"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        heavy = [line for line in result.stderr.splitlines() if line.startswith("HEAVY=")]
        text = " ".join((result.stdout + result.stderr).replace("│", " ").split())
        assert result.returncode == 2, text
        assert message in text, text
        assert json.loads(heavy[-1].removeprefix("HEAVY=")) == []
        assert not out.exists()
