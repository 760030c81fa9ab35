"""The ESM-2 recipes: ``esm2-demo`` (CPU-sized, the CLI's default), ``esm2-gpu`` and the published family.

Every recipe trains the same architecture (``bionemo.esm2.model``) with ESM-2's vocabulary; they differ in
shape and run defaults. Heavy imports happen inside ``train`` / ``predict``.
"""

import functools
from importlib.resources import files
from pathlib import Path
from typing import Any

from bionemo.esm2.catalog import DEMO_SHAPE, ESM2_SHAPES, GPU_SHAPE, ModelShape
from bionemo.recipes.choices import Precision
from bionemo.recipes.registry import Recipe
from bionemo.recipes.settings import RunSettings

__all__ = [
    "BUNDLED_CHECKPOINT",
    "BUNDLED_SEQUENCES",
    "demo",
    "esm2_3b",
    "esm2_8m",
    "esm2_15b",
    "esm2_35m",
    "esm2_150m",
    "esm2_650m",
    "gpu",
]

_RESOURCES = files("bionemo.esm2") / "resources"
BUNDLED_CHECKPOINT = Path(str(_RESOURCES / "esm2_demo.safetensors"))
"""Weights trained by the documented ``bionemo run train`` command (see resources/README)."""
BUNDLED_SEQUENCES = Path(str(_RESOURCES / "demo_sequences.fasta"))
"""Held-out members of the synthetic demo families, predicted by ``bionemo run predict`` by default."""

GPU_FUSIONS = {"bias_dropout_fusion": True}
"""Exact speed-ups for GPUs: megatron's fused bias + dropout + add (RoPE is fused on GPUs without a setting).
Megatron's fused bias-GELU is not used: it is the tanh approximation, not ESM-2's GELU."""

GPU_MODEL = {**GPU_SHAPE.model_settings(), **GPU_FUSIONS}
"""``esm2-gpu``'s model settings (kept by name for ``tools/bench_recipe_throughput.py``)."""


def _recipe(name: str, description: str, model: dict[str, Any], **run: Any) -> Recipe:
    from bionemo.esm2 import predict as predict_module
    from bionemo.esm2 import train as train_module

    defaults = {"model": model, **run}
    return Recipe(
        name=name,
        description=description,
        defaults=defaults,
        train=functools.partial(train_module.train, defaults=defaults, recipe=name),
        predict=functools.partial(predict_module.predict, defaults=defaults, recipe=name),
    )


def demo() -> Recipe:
    """The CPU demo: ESM-2's architecture at 4 layers x 64 (head dim 16), trained on synthetic families."""
    return _recipe(
        "esm2-demo",
        f"ESM-2 architecture, 4 x 64, {DEMO_SHAPE.parameters() / 1e3:.0f}K parameters; CPU demo with bundled weights "
        "trained on synthetic families",
        DEMO_SHAPE.model_settings(),
        micro_batch_size=16,
        global_batch_size=16,
        max_steps=1000,
        val_check_interval=250,
        lr=1e-3,
        precision=Precision.FP32.value,
    )


def gpu() -> Recipe:
    """12 layers x 1024 (151M parameters): a GPU-friendly shape (head dim 64) of the ESM-2 architecture."""
    return _recipe(
        "esm2-gpu",
        f"ESM-2 architecture, 12 x 1024, {GPU_SHAPE.parameters() / 1e6:.0f}M parameters; {GPU_SHAPE.devices}, bf16",
        GPU_MODEL,
        micro_batch_size=32,
        global_batch_size=256,
        max_steps=20000,
        val_check_interval=1000,
        lr=4e-4,
        precision=Precision.BF16.value,
    )


def _family(name: str, shape: ModelShape) -> Recipe:
    size = shape.parameters()
    label = f"{size / 1e9:.1f}B" if size >= 1e9 else f"{size / 1e6:.0f}M"
    small = shape.hidden_size <= 480
    return _recipe(
        name,
        f"ESM-2 {label} ({shape.num_layers} x {shape.hidden_size}, {shape.num_attention_heads} heads); "
        f"train on {shape.devices}; bf16",
        {**shape.model_settings(), **({} if small else GPU_FUSIONS)},
        micro_batch_size=16 if shape.hidden_size <= 1280 else 4,
        global_batch_size=256,
        max_steps=500_000,
        val_check_interval=1000,
        lr=4e-4,
        precision=Precision.BF16.value,
    )


esm2_8m = functools.partial(_family, "esm2-8m", ESM2_SHAPES["esm2-8m"])
esm2_35m = functools.partial(_family, "esm2-35m", ESM2_SHAPES["esm2-35m"])
esm2_150m = functools.partial(_family, "esm2-150m", ESM2_SHAPES["esm2-150m"])
esm2_650m = functools.partial(_family, "esm2-650m", ESM2_SHAPES["esm2-650m"])
esm2_3b = functools.partial(_family, "esm2-3b", ESM2_SHAPES["esm2-3b"])
esm2_15b = functools.partial(_family, "esm2-15b", ESM2_SHAPES["esm2-15b"])


def value(settings: RunSettings, defaults: dict[str, Any], name: str) -> Any:
    """The run setting ``name``: given on the command line / in ``--config``, else the recipe's default."""
    given = getattr(settings, name)
    return defaults.get(name) if given is None else given
