"""The inputs of the recipes: sequence files, masked-language-model datasets and batches, the synthetic demo data.

:mod:`.readers` reads and checks FASTA and CSV files (standard library only: input files are refused before torch
is imported); :mod:`.mlm` holds the masking datasets, batching and data steps (torch); :mod:`.demo` generates the
synthetic demo families. Importing this package imports no torch: the names of :mod:`.mlm` are loaded on first use.
"""

from typing import TYPE_CHECKING

from bionemo.core.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from bionemo.esm2.data.mlm import (
        MaskedProteinDataset,
        PredictionBatches,
        PredictionDataset,
        collate_proteins,
        data_step,
        first_item,
        length_sorted_batches,
        mask_tokens,
        training_data_step,
    )

__all__ = [
    "MaskedProteinDataset",
    "PredictionBatches",
    "PredictionDataset",
    "collate_proteins",
    "data_step",
    "first_item",
    "length_sorted_batches",
    "mask_tokens",
    "training_data_step",
]


__getattr__ = lazy_exports(__name__, {"mlm": __all__})
