"""Amino-acid tokenizer: one token per residue, ESM-style special tokens."""

from collections.abc import Sequence

import torch

__all__ = ["AMINO_ACIDS", "ProteinTokenizer"]

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
"""The 20 standard amino acids, one letter each."""

_RARE = "XBZUO"  # unknown, ambiguous (B, Z) and rare (U, O) residues; all read as X
_SPECIALS = ("<cls>", "<pad>", "<eos>", "<unk>", "<mask>")


class ProteinTokenizer:
    """Maps protein sequences to ids: ``<cls> residues <eos>``, padded with ``<pad>``.

    Vocabulary: 5 special tokens, the 20 standard amino acids and ``X`` (26 ids; the model pads its embedding
    table to a multiple of 8). ``B``, ``Z``, ``U`` and ``O`` read as ``X``; lower case is accepted.
    """

    def __init__(self) -> None:
        self.tokens = [*_SPECIALS, *AMINO_ACIDS, "X"]
        self.ids = {token: i for i, token in enumerate(self.tokens)}
        self.cls_id, self.pad_id, self.eos_id, self.unk_id, self.mask_id = (self.ids[t] for t in _SPECIALS)
        self.residue_ids = torch.tensor([self.ids[a] for a in AMINO_ACIDS])
        table = torch.full((128,), -1, dtype=torch.long)
        for letter in AMINO_ACIDS:
            table[ord(letter)] = table[ord(letter.lower())] = self.ids[letter]
        for letter in _RARE:
            table[ord(letter)] = table[ord(letter.lower())] = self.ids["X"]
        self._table = table

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""
        return len(self.tokens)

    @staticmethod
    def invalid_characters(sequence: str) -> list[str]:
        """The distinct characters of ``sequence`` that are not amino-acid letters, in order of appearance."""
        allowed = set(AMINO_ACIDS + _RARE + AMINO_ACIDS.lower() + _RARE.lower())
        return list(dict.fromkeys(c for c in sequence if c not in allowed))

    def encode(self, sequence: str) -> torch.Tensor:
        """``[len + 2]`` ids: ``<cls>``, one id per residue, ``<eos>``.

        Raises:
            ValueError: For characters outside the amino-acid alphabet.
        """
        bad = self.invalid_characters(sequence)
        if bad:
            raise ValueError(f"characters {bad} are not amino acids; valid: {AMINO_ACIDS} and X, B, Z, U, O")
        codes = torch.frombuffer(bytearray(sequence.encode("ascii")), dtype=torch.uint8).long()
        return torch.cat([torch.tensor([self.cls_id]), self._table[codes], torch.tensor([self.eos_id])])

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Residue letters of ``ids``, special tokens left out."""
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return "".join(self.tokens[i] for i in values if self.tokens[i] not in _SPECIALS)
