"""The ESM-2 recipes: ``esm2-demo`` (CPU-sized, the CLI's default), ``esm2-gpu`` and the published family.

Every recipe trains the same architecture (``bionemo.esm2.model``) with ESM-2's vocabulary; they differ in
shape and run defaults. The commands are the modules below (:mod:`.train`, :mod:`.predict`, and
:mod:`bionemo.esm2.finetune.train`), imported inside ``train`` / ``finetune`` / ``predict``: importing the
recipes imports nothing heavy, and nothing the commands use imports the recipes.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Unpack, cast

from bionemo.esm2.catalog import DEMO_SHAPE, ESM2_SHAPES, GPU_SHAPE, ModelShape
from bionemo.esm2.recipes.inputs import BUNDLED_CHECKPOINT, BUNDLED_SEQUENCES
from bionemo.esm2.recipes.model_settings import MODEL_KEYS, ESM2ModelSettings
from bionemo.recipes.choices import Precision
from bionemo.recipes.registry import CPUDefaults, RecipeDefaults, SummaryRows

if TYPE_CHECKING:
    from bionemo.recipes.settings import RunSettings

__all__ = [
    "BUNDLED_CHECKPOINT",
    "BUNDLED_SEQUENCES",
    "ESM2_8M_CPU",
    "ESM2ModelSettings",
    "ESM2Recipe",
    "MODEL_KEYS",
    "demo",
    "esm2_3b",
    "esm2_8m",
    "esm2_15b",
    "esm2_35m",
    "esm2_150m",
    "esm2_650m",
    "gpu",
]


def _model(shape: ModelShape, **extra: Unpack[ESM2ModelSettings]) -> ESM2ModelSettings:
    """``shape``'s model settings (``ModelShape.model_settings``), then ``extra``."""
    model = ESM2ModelSettings(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads,
        ffn_hidden_size=shape.ffn_hidden_size,
        seq_length=shape.seq_length,
    )
    model.update(extra)
    return model


# No megatron fusion is switched on for GPUs. RoPE is fused on GPUs without a setting, the linear layers add their
# bias inside the GEMM (so no bias reaches the bias-dropout-add), megatron's fused bias-GELU is the tanh approximation
# (not ESM-2's GELU), and with ESM-2's hidden_dropout of 0 megatron's compiled bias-dropout-add
# (bias_dropout_fusion) is the same single add as the eager one plus torch.compile's per-call host cost (measured
# slower: docs/benchmarks.md#training-throughput-as-a-share-of-peak). With hidden_dropout > 0,
# bias_dropout_fusion: true fuses the dropout into the add.
GPU_MODEL = _model(GPU_SHAPE)
"""``esm2-gpu``'s model settings."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ESM2Recipe:
    """An ESM-2 recipe (a :class:`bionemo.recipes.Recipe`): its name, description and defaults."""

    name: str
    """The name users pass to ``--recipe``."""
    description: str
    """One line for ``bionemo recipes list``."""
    defaults: RecipeDefaults
    """Run defaults; ``defaults.model`` holds :class:`ESM2ModelSettings`."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.defaults.model) - MODEL_KEYS)
        if unknown:
            raise ValueError(f"recipe {self.name}: unknown model settings {unknown}; valid: {sorted(MODEL_KEYS)}")

    @property
    def model(self) -> ESM2ModelSettings:
        """The recipe's model settings (``defaults.model``), typed."""
        return cast(ESM2ModelSettings, self.defaults.model)

    def train(self, settings: "RunSettings") -> SummaryRows:
        """``bionemo run train``: see :func:`bionemo.esm2.recipes.train.train`."""
        from bionemo.esm2.recipes.train import train

        return train(settings, defaults=self.defaults, recipe=self.name)

    def finetune(self, settings: "RunSettings") -> SummaryRows:
        """``bionemo run finetune``: see :func:`bionemo.esm2.finetune.train.finetune`."""
        from bionemo.esm2.finetune.train import finetune

        return finetune(settings, defaults=self.defaults, recipe=self.name)

    def predict(self, settings: "RunSettings") -> SummaryRows:
        """``bionemo run predict``: see :func:`bionemo.esm2.recipes.predict.predict`."""
        from bionemo.esm2.recipes.predict import predict

        return predict(settings, defaults=self.defaults, recipe=self.name)


def demo() -> ESM2Recipe:
    """The CPU demo: ESM-2's architecture at 4 layers x 64 (head dim 16), trained on synthetic families."""
    return ESM2Recipe(
        name="esm2-demo",
        description=f"ESM-2 architecture, 4 x 64, {DEMO_SHAPE.parameters() / 1e3:.0f}K parameters; CPU demo with "
        "bundled weights trained on synthetic families",
        defaults=RecipeDefaults(
            micro_batch_size=16,
            global_batch_size=16,
            max_steps=1000,
            val_check_interval=250,
            lr=1e-3,
            precision=Precision.FP32,
            model=_model(DEMO_SHAPE),
            tokens_on_gpus=True,
        ),
    )


def gpu() -> ESM2Recipe:
    """12 layers x 1024 (151M parameters): a GPU-friendly shape (head dim 64) of the ESM-2 architecture."""
    return ESM2Recipe(
        name="esm2-gpu",
        description=f"ESM-2 architecture, 12 x 1024, {GPU_SHAPE.parameters() / 1e6:.0f}M parameters; "
        f"{GPU_SHAPE.devices}, bf16",
        defaults=RecipeDefaults(
            micro_batch_size=32,
            global_batch_size=256,
            max_steps=20000,
            val_check_interval=1000,
            lr=4e-4,
            precision=Precision.BF16,
            model=GPU_MODEL,
            tokens_on_gpus=True,
        ),
    )


def _family(name: str, cpu: CPUDefaults | None = None) -> ESM2Recipe:
    """The published ESM-2 size ``name`` (``ESM2_SHAPES``); ``cpu``: its defaults for training on CPUs."""
    shape = ESM2_SHAPES[name]
    size = shape.parameters()
    label = f"{size / 1e9:.1f}B" if size >= 1e9 else f"{size / 1e6:.0f}M"
    on_cpus = "" if cpu is None else f"; on CPUs {cpu.max_steps} steps x {cpu.global_batch_size}"
    return ESM2Recipe(
        name=name,
        description=f"ESM-2 {label} ({shape.num_layers} x {shape.hidden_size}, {shape.num_attention_heads} heads); "
        f"train on {shape.devices}; bf16{on_cpus}",
        defaults=RecipeDefaults(
            micro_batch_size=16 if shape.hidden_size <= 1280 else 4,
            global_batch_size=256,
            max_steps=500_000,
            val_check_interval=1000,
            lr=4e-4,
            precision=Precision.BF16,
            model=_model(shape),
            cpu=cpu,
            tokens_on_gpus=True,
        ),
    )


ESM2_8M_CPU = CPUDefaults(max_steps=500, global_batch_size=32, val_check_interval=100)
"""``esm2-8m`` on CPUs: 500 steps of 32 sequences, a run that finishes on a CPU with batches that still train,
against 500,000 steps of 256 on GPUs."""


def esm2_8m() -> ESM2Recipe:
    """ESM-2 8M (6 x 320); on CPUs :data:`ESM2_8M_CPU`."""
    return _family("esm2-8m", cpu=ESM2_8M_CPU)


def esm2_35m() -> ESM2Recipe:
    """ESM-2 35M (12 x 480)."""
    return _family("esm2-35m")


def esm2_150m() -> ESM2Recipe:
    """ESM-2 150M (30 x 640)."""
    return _family("esm2-150m")


def esm2_650m() -> ESM2Recipe:
    """ESM-2 650M (33 x 1280)."""
    return _family("esm2-650m")


def esm2_3b() -> ESM2Recipe:
    """ESM-2 3B (36 x 2560)."""
    return _family("esm2-3b")


def esm2_15b() -> ESM2Recipe:
    """ESM-2 15B (48 x 5120)."""
    return _family("esm2-15b")
