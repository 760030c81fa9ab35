"""Model building blocks on megatron-core in plain torch (no Transformer Engine): LoRA adapters.

Importing this package imports megatron-core (after ``bionemo.core.megatron_env.prepare_megatron_import``).
"""

from bionemo.layers.lora import (
    LoRAConfig,
    LoRALinear,
    LoRATarget,
    apply_lora,
    load_lora_state_dict,
    lora_modules,
    lora_state_dict,
    merge_lora,
)

__all__ = [
    "LoRAConfig",
    "LoRALinear",
    "LoRATarget",
    "apply_lora",
    "load_lora_state_dict",
    "lora_modules",
    "lora_state_dict",
    "merge_lora",
]
