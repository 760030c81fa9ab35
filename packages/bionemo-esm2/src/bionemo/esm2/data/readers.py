"""Read protein sequences from FASTA or CSV (plain or gzipped), validating everything before any work starts.

Only the standard library is used (``csv``, ``gzip``), so the CLI checks input files before it imports torch.
"""

import csv
import dataclasses
import gzip
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bionemo.esm2.tokenizer import ProteinTokenizer

__all__ = [
    "CSV_SUFFIXES",
    "DATA_FORMATS",
    "FASTA_SUFFIXES",
    "GZIP_SUFFIX",
    "InputError",
    "SequenceRecord",
    "lowercase_note",
    "open_text",
    "read_sequences",
]

FASTA_SUFFIXES = (".fasta", ".fa", ".faa", ".fas")
"""File name endings read as FASTA (any case)."""

CSV_SUFFIXES = (".csv",)
"""File name endings read as CSV with a header holding a ``sequence`` column (any case)."""

GZIP_SUFFIX = ".gz"
"""Appended to any of the endings above: the file is gzip-compressed and decompressed while it is read."""

DATA_FORMATS = (
    f"FASTA ({'/'.join(FASTA_SUFFIXES)}) or CSV with a 'sequence' column and optionally 'id' "
    f"({'/'.join(CSV_SUFFIXES)}), either also gzipped ({GZIP_SUFFIX})"
)
"""What :func:`read_sequences` accepts, in words (the CLI's ``--data`` help and every extension error)."""


class InputError(ValueError):
    """A data file the recipe cannot use; the message names the file, the record and what is valid."""


@dataclass(frozen=True, slots=True)
class SequenceRecord:
    """One input sequence and its id (the FASTA header's first word, or the CSV ``id`` column)."""

    id: str
    sequence: str
    truncated_from: int | None = None
    """The sequence's length before ``--truncate`` cut it, or None when it was not cut."""
    lowercase: bool = False
    """The file gave the sequence with lower-case letters; ``sequence`` holds it in upper case."""


def read_sequences(path: Path, max_length: int | None = None, truncate: bool = False) -> list[SequenceRecord]:
    """Read and validate every sequence of a FASTA or CSV file (:data:`DATA_FORMATS`), gzipped or not.

    Args:
        path: The file. CSV files need a header with a ``sequence`` column; an ``id`` column is optional. A name
            ending in ``.gz`` (``seqs.fasta.gz``, ``seqs.csv.gz``) is decompressed as it is read, line by line.
        max_length: Longest sequence (residues) allowed, or ``None``.
        truncate: Cut longer sequences to ``max_length`` instead of refusing them.

    A UTF-8 byte-order mark is accepted, a trailing ``*`` (UniProt's end marker) is dropped and lower-case letters
    are read as upper case (the record's ``lowercase`` says so).

    Raises:
        InputError: Missing or empty file, unknown extension (Parquet included: no Parquet reader is installed),
            a gzipped file that is truncated, damaged or not gzip at all, malformed record, alignment gaps
            (``-``, ``.``), characters outside the alphabet, duplicate ids, or a sequence longer than
            ``max_length`` without ``truncate``.
    """
    if not path.exists():
        raise InputError(f"data file {path} does not exist")
    if not path.is_file():
        raise InputError(f"data path {path} is not a file")
    parse, gzipped = _parser(path)
    if gzipped:
        records = _read_gzip(path, parse)
    else:
        with open_text(path) as f:
            records = parse(path, f)
    if not records:
        raise InputError(f"data file {path} holds no sequences")
    seen: set[str] = set()
    checked = []
    for record in records:
        if record.id in seen:
            raise InputError(f"{path}: sequence id {record.id!r} appears more than once; ids must be unique")
        seen.add(record.id)
        if record.sequence.endswith("*"):  # UniProt-style stop / end marker
            record = SequenceRecord(record.id, record.sequence[:-1])
        if "-" in record.sequence or "." in record.sequence:  # C-speed test; the positions only for the message
            gaps = [i for i, c in enumerate(record.sequence) if c in "-."]
            raise InputError(
                f"{path}: sequence {record.id!r} has a gap {record.sequence[gaps[0]]!r} at residue {gaps[0] + 1} "
                f"({len(gaps)} gap(s) in all); give unaligned sequences (remove '-' and '.')"
            )
        bad = ProteinTokenizer.invalid_characters(record.sequence)
        if bad:
            raise InputError(
                f"{path}: sequence {record.id!r} has characters {bad} outside the amino-acid alphabet "
                "(valid: ACDEFGHIKLMNPQRSTVWY and X, B, Z, U, O)"
            )
        upper = record.sequence.upper()  # ASCII letters only by now
        if upper != record.sequence:
            record = dataclasses.replace(record, sequence=upper, lowercase=True)
        if max_length is not None and len(record.sequence) > max_length:
            if not truncate:
                raise InputError(
                    f"{path}: sequence {record.id!r} has {len(record.sequence)} residues, more than the model's "
                    f"{max_length}; pass --truncate to cut sequences to {max_length}"
                )
            record = dataclasses.replace(
                record, sequence=record.sequence[:max_length], truncated_from=len(record.sequence)
            )
        checked.append(record)
    return checked


def lowercase_note(records: Iterable[SequenceRecord]) -> str | None:
    """The summary's line on sequences given in lower case (read as upper case), or None when there were none."""
    count = sum(record.lowercase for record in records)
    if not count:
        return None
    return f"{count} sequence{'s' if count != 1 else ''} had lowercase letters, read as uppercase"


_Parse = Callable[[Path, IO[str]], list[SequenceRecord]]


def _parser(path: Path) -> tuple[_Parse, bool]:
    """The parser for ``path``'s format from its name, and whether it is gzipped.

    Raises:
        InputError: A name that ends in none of the accepted endings; Parquet is named and a conversion given.
    """
    name = path.name.lower()
    gzipped = name.endswith(GZIP_SUFFIX)
    inner = name.removesuffix(GZIP_SUFFIX) if gzipped else name
    if inner.endswith(FASTA_SUFFIXES):
        return _read_fasta, gzipped
    if inner.endswith(CSV_SUFFIXES):
        return _read_csv, gzipped
    valid = ", ".join((*FASTA_SUFFIXES, *CSV_SUFFIXES))
    gz = ", ".join(s + GZIP_SUFFIX for s in (*FASTA_SUFFIXES, *CSV_SUFFIXES))
    if inner.endswith((".parquet", ".pq")):
        raise InputError(
            f"data file {path} is Parquet, which bionemo does not read (no Parquet reader is installed with it); "
            "write it as CSV with a 'sequence' column (and optionally 'id'), e.g. with pandas: "
            f"pandas.read_parquet('{path}').to_csv('sequences.csv', index=False), or as FASTA. "
            f"Valid: {valid}, or gzipped: {gz}"
        )
    suffix = "".join(path.suffixes[-2:]) if gzipped else path.suffix
    given = f"extension {suffix!r}" if suffix else "no extension"
    raise InputError(f"data file {path} has {given}; use {valid}, or gzipped: {gz}")


def open_text(path: Path) -> IO[str]:
    """``path`` as text as the readers read it (UTF-8, byte-order mark dropped), decompressed if it ends in ``.gz``."""
    if path.name.lower().endswith(GZIP_SUFFIX):
        return gzip.open(path, "rt", newline="", encoding="utf-8-sig", errors="replace")
    return path.open(newline="", encoding="utf-8-sig", errors="replace")


def _read_gzip(path: Path, parse: _Parse) -> list[SequenceRecord]:
    """``parse`` over ``path`` decompressed line by line; a broken gzip stream is an :class:`InputError`."""
    try:
        with open_text(path) as f:
            return parse(path, f)
    except gzip.BadGzipFile as error:
        if "Not a gzipped file" in str(error):
            raise InputError(
                f"data file {path} is not gzip-compressed although its name ends in {GZIP_SUFFIX}; "
                f"rename it without {GZIP_SUFFIX} if it is plain text, or compress it with gzip"
            ) from None
        raise InputError(f"data file {path} is a damaged gzip file ({error}); check it with `gzip -t {path}`") from None
    except EOFError:
        raise InputError(
            f"data file {path} ends before its gzip stream does (a truncated download or copy?); "
            f"check it with `gzip -t {path}` and fetch it again"
        ) from None
    except zlib.error as error:
        raise InputError(f"data file {path} is a damaged gzip file ({error}); check it with `gzip -t {path}`") from None


def _read_fasta(path: Path, lines: IO[str]) -> list[SequenceRecord]:
    records: list[SequenceRecord] = []
    header: str | None = None
    header_line = 0
    chunks: list[str] = []

    def close() -> None:
        if header is None:
            return
        sequence = "".join(chunks)
        if not sequence:
            raise InputError(f"{path}:{header_line}: record {header!r} has no sequence")
        records.append(SequenceRecord(header, sequence))

    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith(">"):
            close()
            words = line[1:].split()
            if not words:
                raise InputError(f"{path}:{number}: FASTA header has no id")
            header, header_line, chunks = words[0], number, []
        elif header is None:
            raise InputError(f"{path}:{number}: sequence data before the first '>' header; is this FASTA?")
        else:
            chunks.append(line.replace(" ", ""))
    close()
    return records


def _read_csv(path: Path, lines: IO[str]) -> list[SequenceRecord]:
    reader = csv.DictReader(lines)
    columns = [c.strip().lower() for c in (reader.fieldnames or [])]
    if "sequence" not in columns:
        raise InputError(f"{path}: CSV needs a header with a 'sequence' column (and optionally 'id'); got {columns}")
    records = []
    for number, row in enumerate(reader, start=2):
        row = {(k or "").strip().lower(): (v or "").strip() for k, v in row.items()}
        sequence = row.get("sequence", "")
        if not sequence:
            raise InputError(f"{path}:{number}: row has an empty 'sequence'")
        records.append(SequenceRecord(row.get("id") or f"row{number - 1}", sequence))
    return records
