"""The ESM-2 family's shapes and the recipe names that train them; standard library only (cheap to import)."""

from dataclasses import dataclass
from typing import Any

__all__ = ["ESM2_SHAPES", "ESM_DEFAULTS", "RECIPE_TARGETS", "ModelShape"]

ESM_DEFAULTS: dict[str, Any] = {
    "seq_length": 1026,
    "layernorm_epsilon": 1e-5,
    "token_dropout": True,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "vocab_size": 33,
}
"""ESM-2's settings that a Hugging Face config also holds: ``ESM2Config``'s defaults for them (it reads them here)
and what a bionemo file that omits one (older files) means."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelShape:
    """The hyper-parameters that set an ESM-2 model's size (fair-esm's and Hugging Face's published shapes)."""

    num_layers: int
    """Transformer layers."""
    hidden_size: int
    """Width of the residual stream."""
    num_attention_heads: int
    """Attention heads per layer."""
    ffn_hidden_size: int
    """Width of the MLP (4 x hidden_size throughout the family)."""
    seq_length: int = ESM_DEFAULTS["seq_length"]
    """Most tokens per sequence, ``<cls>`` and ``<eos>`` included (1024 residues)."""
    devices: str = "1 GPU"
    """Suggested devices and tensor parallelism for training (prediction needs fewer)."""

    def model_settings(self) -> dict[str, int]:
        """The ``model:`` settings of a recipe (``ESM2Config`` fields)."""
        return {
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "ffn_hidden_size": self.ffn_hidden_size,
            "seq_length": self.seq_length,
        }

    def parameters(self, vocab_size: int = 33) -> int:
        """Parameters of the language model: ``EsmForMaskedLM``'s less its contact head.

        The contact head (``num_layers * num_attention_heads + 1`` more, counted by ``EsmForMaskedLM`` and by
        fair-esm's published sizes) is optional in checkpoints and no parameter of the megatron model.
        """
        h, f = self.hidden_size, self.ffn_hidden_size
        layer = 4 * (h * h + h) + 2 * 2 * h + (h * f + f) + (f * h + h)
        return vocab_size * h + self.num_layers * layer + 2 * h + (h * h + h) + 2 * h + vocab_size


ESM2_SHAPES: dict[str, ModelShape] = {
    "esm2-8m": ModelShape(num_layers=6, hidden_size=320, num_attention_heads=20, ffn_hidden_size=1280,
                          devices="CPU or 1 GPU"),
    "esm2-35m": ModelShape(num_layers=12, hidden_size=480, num_attention_heads=20, ffn_hidden_size=1920,
                           devices="1 GPU"),
    "esm2-150m": ModelShape(num_layers=30, hidden_size=640, num_attention_heads=20, ffn_hidden_size=2560,
                            devices="1 GPU"),
    "esm2-650m": ModelShape(num_layers=33, hidden_size=1280, num_attention_heads=20, ffn_hidden_size=5120,
                            devices="1-8 GPUs, TP 1"),
    "esm2-3b": ModelShape(num_layers=36, hidden_size=2560, num_attention_heads=40, ffn_hidden_size=10240,
                          devices="8 GPUs, TP 1-2"),
    "esm2-15b": ModelShape(num_layers=48, hidden_size=5120, num_attention_heads=40, ffn_hidden_size=20480,
                           devices="16+ GPUs, TP 4-8"),
}  # fmt: skip
"""The published ESM-2 sizes (fair-esm ``esm2_t{layers}_{size}_UR50D``), by recipe name."""

DEMO_SHAPE = ModelShape(num_layers=4, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256, devices="CPU")
"""``esm2-demo``: the ESM-2 architecture and vocabulary at CPU size (head dim 16), up to 1024 residues."""

GPU_SHAPE = ModelShape(num_layers=12, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, devices="1 GPU")
"""``esm2-gpu``: a 152M-parameter ESM-2 whose shape keeps an H200 busier than esm2-150m's (head dim 64)."""

RECIPE_TARGETS: dict[str, str] = {
    "esm2-demo": "bionemo.esm2.recipes:demo",
    "esm2-gpu": "bionemo.esm2.recipes:gpu",
    **{name: f"bionemo.esm2.recipes:{name.replace('-', '_')}" for name in ESM2_SHAPES},
}
"""Every recipe of this package, ``name -> "module:attribute"`` (also declared as ``bionemo.recipes`` entry points)."""
