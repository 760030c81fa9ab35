"""Deterministic synthetic protein families: data a small model can learn, generated on any machine.

Not real proteins. Each family has a random ancestor; members copy it with point substitutions and short
insertions/deletions, so residues are predictable from the rest of the sequence and from family patterns.
"""

import os
import random
from pathlib import Path

from bionemo.core.atomic_files import replaced_atomically
from bionemo.esm2.data.readers import SequenceRecord
from bionemo.esm2.tokenizer import AMINO_ACIDS

__all__ = ["demo_families", "write_fasta"]


def demo_families(
    num_families: int = 8,
    members_per_family: int = 64,
    held_out_per_family: int = 4,
    min_length: int = 40,
    max_length: int = 60,
    substitution_rate: float = 0.08,
    seed: int = 0,
) -> tuple[list[SequenceRecord], list[SequenceRecord]]:
    """Training members and held-out members of the same families, identical for identical arguments.

    Sequences are named ``fam{F}_{M}``; each family's last ``held_out_per_family`` members are held out.
    """
    rng = random.Random(seed)
    records = []
    held_out = []
    for family in range(num_families):
        ancestor = [rng.choice(AMINO_ACIDS) for _ in range(rng.randint(min_length, max_length))]
        for member in range(members_per_family + held_out_per_family):
            residues = [rng.choice(AMINO_ACIDS) if rng.random() < substitution_rate else a for a in ancestor]
            if rng.random() < 0.3:  # a short deletion or insertion
                at = rng.randrange(len(residues))
                if rng.random() < 0.5:
                    del residues[at : at + rng.randint(1, 3)]
                else:
                    residues[at:at] = [rng.choice(AMINO_ACIDS) for _ in range(rng.randint(1, 3))]
            record = SequenceRecord(f"fam{family}_{member}", "".join(residues))
            (records if member < members_per_family else held_out).append(record)
    return records, held_out


def write_fasta(records: list[SequenceRecord], path: str | os.PathLike[str]) -> None:
    """Write ``records`` as FASTA, 60 residues per line, atomically: a reader sees the whole file or none.

    The text goes to a temporary file next to ``path``, then replaces it (:func:`replaced_atomically`); so
    several processes writing the same records (every task of an ``srun``) never expose a half-written file.
    """
    with replaced_atomically(Path(path)) as temporary, temporary.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(f">{record.id}\n")
            for start in range(0, len(record.sequence), 60):
                f.write(record.sequence[start : start + 60] + "\n")
