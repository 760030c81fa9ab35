"""The ESM-2 vocabulary (33 tokens, Hugging Face's order) and a one-token-per-residue tokenizer.

torch is imported when a tokenizer is made, not with this module: the alphabet and
:meth:`ProteinTokenizer.invalid_characters` check input files before the CLI imports anything heavy.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["AMINO_ACIDS", "ESM_TOKENS", "RESIDUE_LETTERS", "ProteinTokenizer", "encoded_length"]

ESM_TOKENS = (
    "<cls>", "<pad>", "<eos>", "<unk>",
    "L", "A", "G", "V", "S", "E", "R", "T", "I", "D", "P", "K", "Q", "N", "F", "Y", "M", "H", "W", "C",
    "X", "B", "U", "Z", "O", ".", "-", "<null_1>", "<mask>",
)  # fmt: skip
"""ESM-2's vocabulary in id order, as in fair-esm and Hugging Face's ``vocab.txt`` for every ESM-2 size."""

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
"""The 20 standard amino acids, one letter each."""

RESIDUE_LETTERS = AMINO_ACIDS + "XBUZO"
"""Letters a sequence may hold: the standard amino acids, unknown (X), ambiguous (B, Z) and rare (U, O)."""
_DROP_RESIDUES = str.maketrans("", "", RESIDUE_LETTERS + RESIDUE_LETTERS.lower())
"""``str.translate`` table deleting every residue letter (either case): what is left is not a residue."""


def encoded_length(sequence: str) -> int:
    """Tokens of ``sequence`` once encoded: ``<cls>``, one per residue, ``<eos>``."""
    return len(sequence) + 2


class ProteinTokenizer:
    """Maps protein sequences to ESM-2 ids: ``<cls> residues <eos>``, padded with ``<pad>``.

    Every letter of :data:`RESIDUE_LETTERS` keeps its own id (as in Hugging Face's ``EsmTokenizer``); lower
    case is accepted. The ids match ``EsmTokenizer`` for any sequence of those letters.
    """

    def __init__(self) -> None:
        import torch

        self.tokens = list(ESM_TOKENS)
        self.ids = {token: i for i, token in enumerate(self.tokens)}
        self.cls_id, self.pad_id, self.eos_id, self.unk_id, self.mask_id = (
            self.ids[t] for t in ("<cls>", "<pad>", "<eos>", "<unk>", "<mask>")
        )
        self.residue_ids = torch.tensor([self.ids[a] for a in AMINO_ACIDS])
        table = torch.full((128,), -1, dtype=torch.long)
        for letter in RESIDUE_LETTERS:
            table[ord(letter)] = table[ord(letter.lower())] = self.ids[letter]
        self._table = table

    @property
    def vocab_size(self) -> int:
        """Number of token ids (33)."""
        return len(self.tokens)

    @staticmethod
    def invalid_characters(sequence: str) -> list[str]:
        """The distinct characters of ``sequence`` that are not residue letters, in order of appearance."""
        return list(dict.fromkeys(sequence.translate(_DROP_RESIDUES)))  # str.translate: no per-letter Python loop

    def encode(self, sequence: str) -> "torch.Tensor":
        """``[len + 2]`` ids: ``<cls>``, one id per residue, ``<eos>``.

        Raises:
            ValueError: For characters outside :data:`RESIDUE_LETTERS`.
        """
        bad = self.invalid_characters(sequence)
        if bad:
            raise ValueError(f"characters {bad} are not amino acids; valid: {AMINO_ACIDS} and X, B, U, Z, O")
        import torch

        codes = torch.frombuffer(bytearray(sequence.encode("ascii")), dtype=torch.uint8).long()
        return torch.cat([torch.tensor([self.cls_id]), self._table[codes], torch.tensor([self.eos_id])])

    def decode(self, ids: "Sequence[int] | torch.Tensor") -> str:
        """Residue letters of ``ids``, special tokens left out."""
        import torch

        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return "".join(self.tokens[i] for i in values if len(self.tokens[i]) == 1 and self.tokens[i].isalpha())
