"""The per-sequence checks of reading input: characters outside the alphabet and alignment gaps, as a per-letter
reference finds them (the checks run at C speed: ``str.translate`` and ``in``)."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bionemo.esm2.data.readers import InputError, read_sequences
from bionemo.esm2.tokenizer import RESIDUE_LETTERS, ProteinTokenizer

LETTERS = RESIDUE_LETTERS + RESIDUE_LETTERS.lower() + "-.*1 jJ\u00e9"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=LETTERS, max_size=60))
def test_invalid_characters_are_the_distinct_non_residues_in_order(sequence):
    allowed = set(RESIDUE_LETTERS + RESIDUE_LETTERS.lower())
    reference = list(dict.fromkeys(c for c in sequence if c not in allowed))
    assert ProteinTokenizer.invalid_characters(sequence) == reference


@pytest.mark.parametrize(
    ("sequence", "message"),
    [("MK-LV.A", "gap '-' at residue 3 (2 gap(s) in all)"), ("MKLV.", "gap '.' at residue 5 (1 gap(s) in all)")],
)
def test_a_gap_is_refused_with_its_first_position_and_count(tmp_path: Path, sequence, message):
    fasta = tmp_path / "gaps.fasta"
    fasta.write_text(f">ok\nMKLV\n>aligned\n{sequence}\n")
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_sequences(fasta)
