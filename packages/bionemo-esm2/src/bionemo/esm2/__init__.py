"""ESM-2 protein language models on megatron-core: tokenizer, model, Hugging Face conversion and recipes.

Cheap to import; the model (megatron-core) and the recipes are imported from their modules.
"""

from bionemo.esm2.catalog import ESM2_SHAPES, RECIPE_TARGETS, ModelShape
from bionemo.esm2.tokenizer import ESM_TOKENS, ProteinTokenizer

__all__ = ["ESM2_SHAPES", "ESM_TOKENS", "RECIPE_TARGETS", "ModelShape", "ProteinTokenizer"]
