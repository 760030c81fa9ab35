"""Read protein sequences from FASTA or CSV, validating everything before any work starts."""

import csv
from dataclasses import dataclass
from pathlib import Path

from bionemo.esm2.tokenizer import ProteinTokenizer

__all__ = ["InputError", "SequenceRecord", "read_sequences"]


class InputError(ValueError):
    """A data file the recipe cannot use; the message names the file, the record and what is valid."""


@dataclass(frozen=True, slots=True)
class SequenceRecord:
    """One input sequence and its id (the FASTA header's first word, or the CSV ``id`` column)."""

    id: str
    sequence: str
    truncated_from: int | None = None
    """The sequence's length before ``--truncate`` cut it, or None when it was not cut."""


def read_sequences(path: Path, max_length: int | None = None, truncate: bool = False) -> list[SequenceRecord]:
    """Read and validate every sequence of a ``.fasta``/``.fa``/``.faa`` or ``.csv`` file.

    Args:
        path: The file. CSV files need a header with a ``sequence`` column; an ``id`` column is optional.
        max_length: Longest sequence (residues) allowed, or ``None``.
        truncate: Cut longer sequences to ``max_length`` instead of refusing them.

    A UTF-8 byte-order mark is accepted and a trailing ``*`` (UniProt's end marker) is dropped.

    Raises:
        InputError: Missing or empty file, unknown extension, malformed record, alignment gaps (``-``, ``.``),
            characters outside the alphabet, duplicate ids, or a sequence longer than ``max_length`` without
            ``truncate``.
    """
    if not path.exists():
        raise InputError(f"data file {path} does not exist")
    if not path.is_file():
        raise InputError(f"data path {path} is not a file")
    suffix = path.suffix.lower()
    if suffix in (".fasta", ".fa", ".faa", ".fas"):
        records = _read_fasta(path)
    elif suffix == ".csv":
        records = _read_csv(path)
    else:
        raise InputError(f"data file {path} has extension {suffix!r}; use .fasta, .fa, .faa, .fas or .csv")
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
        gaps = [i for i, c in enumerate(record.sequence) if c in "-."]
        if gaps:
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
        if max_length is not None and len(record.sequence) > max_length:
            if not truncate:
                raise InputError(
                    f"{path}: sequence {record.id!r} has {len(record.sequence)} residues, more than the model's "
                    f"{max_length}; pass --truncate to cut sequences to {max_length}"
                )
            record = SequenceRecord(record.id, record.sequence[:max_length], truncated_from=len(record.sequence))
        checked.append(record)
    return checked


def _read_fasta(path: Path) -> list[SequenceRecord]:
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

    with path.open(encoding="utf-8-sig", errors="replace") as f:
        for number, raw in enumerate(f, start=1):
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


def _read_csv(path: Path) -> list[SequenceRecord]:
    with path.open(newline="", encoding="utf-8-sig", errors="replace") as f:
        reader = csv.DictReader(f)
        columns = [c.strip().lower() for c in (reader.fieldnames or [])]
        if "sequence" not in columns:
            raise InputError(
                f"{path}: CSV needs a header with a 'sequence' column (and optionally 'id'); got {columns}"
            )
        records = []
        for number, row in enumerate(reader, start=2):
            row = {(k or "").strip().lower(): (v or "").strip() for k, v in row.items()}
            sequence = row.get("sequence", "")
            if not sequence:
                raise InputError(f"{path}:{number}: row has an empty 'sequence'")
            records.append(SequenceRecord(row.get("id") or f"row{number - 1}", sequence))
    return records
