"""The tensors of a fine-tuned model file, by name and shape: encoder without LM head, LoRA factors, head.

Only the standard library is used, so ``bionemo.esm2.checkpoints.header`` checks a fine-tuned file from its
safetensors header before torch is imported. :mod:`bionemo.esm2.finetune.spec` says what such a file holds.
"""

from collections.abc import Mapping
from typing import Any

from bionemo.esm2.finetune.head_config import HeadConfig, HeadKind
from bionemo.esm2.finetune.spec import FINETUNE_KEY, HEAD_PREFIX, FinetuneSpec, LoRASettings
from bionemo.esm2.hf.layout import (
    CheckpointError,
    TensorInfo,
    bionemo_shapes,
    check_bionemo_layout,
    check_tensor,
    listing,
)

__all__ = [
    "LORA_FACTORS",
    "LORA_MODULES",
    "check_finetuned_layout",
    "head_shapes",
    "lora_shapes",
    "read_finetune_spec",
]

LORA_MODULES = {
    "qkv": "self_attention.linear_qkv",
    "proj": "self_attention.linear_proj",
    "fc1": "mlp.linear_fc1",
    "fc2": "mlp.linear_fc2",
}
""":class:`~bionemo.esm2.finetune.spec.LoRASettings` target -> the adapted module's path in a transformer layer
(``bionemo.layers.LoRATarget``'s values, without importing that module: it needs torch)."""

LORA_FACTORS = (".lora_A.weight", ".lora_B.weight")
"""How the names of an adapted layer's whole factors ``A [rank, in]`` and ``B [out, rank]`` end."""


def read_finetune_spec(metadata: Mapping[str, Any], where: str) -> FinetuneSpec | None:
    """The :class:`FinetuneSpec` of a weights file's decoded metadata, or None for pretrained weights.

    Raises:
        CheckpointError: ``where`` (the file), then what is wrong with the :data:`FINETUNE_KEY` entry.
    """
    data = metadata.get(FINETUNE_KEY)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise CheckpointError(
            f"{where}: its fine-tuning metadata ({FINETUNE_KEY!r}) is a JSON {type(data).__name__}, not an object; "
            "the file is damaged or was not written by bionemo"
        )
    try:
        return FinetuneSpec.from_json(data)
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise CheckpointError(
            f"{where}: its fine-tuning metadata ({FINETUNE_KEY!r}) cannot be read: {error}; the file is damaged or "
            "was written by another version of bionemo"
        ) from None


def head_shapes(head: HeadConfig, hidden_size: int, num_outputs: int) -> dict[str, tuple[int, ...]]:
    """Name (``head.``-prefixed) -> shape of every tensor of the head ``head`` on an encoder of ``hidden_size``.

    The names and shapes of ``bionemo.esm2.finetune.heads.build_head``'s module's ``state_dict``.
    """
    h, n = hidden_size, num_outputs
    if head.kind is HeadKind.HF_SEQUENCE:
        shapes = {"dense": ((h, h), (h,)), "out_proj": ((n, h), (n,))}
    elif head.kind is HeadKind.HF_TOKEN:
        shapes = {"classifier": ((n, h), (n,))}
    elif head.kind is HeadKind.MEAN_MLP:
        assert head.hidden_size is not None  # HeadConfig fills it in
        m = head.hidden_size
        shapes = {"dense": ((m, h), (m,)), "out_proj": ((n, m), (n,))}
    else:
        assert head.hidden_size is not None  # HeadConfig fills it in
        assert head.kernel_size is not None
        c = head.hidden_size
        shapes = {"conv": ((c, h, head.kernel_size), (c,)), "classifier": ((n, c), (n,))}
    return {
        f"{HEAD_PREFIX}{module}.{kind}": shape
        for module, pair in shapes.items()
        for kind, shape in zip(("weight", "bias"), pair, strict=True)
    }


def lora_shapes(lora: LoRASettings, model: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every whole LoRA factor of an encoder with ``model`` settings adapted as ``lora`` says.

    ``<layer>.lora_A.weight`` ``[rank, in]`` and ``<layer>.lora_B.weight`` ``[out, rank]`` for each transformer
    layer and target, where ``[out, in]`` is the adapted layer's weight (megatron's layout: fused q/k/v rows).
    """
    encoder = bionemo_shapes(model, lm_head=False)
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(int(model["num_layers"])):
        for target in lora.targets:
            layer = f"decoder.layers.{i}.{LORA_MODULES[target]}"
            out, inp = encoder[f"{layer}.weight"]
            shapes[f"{layer}{LORA_FACTORS[0]}"] = (lora.rank, inp)
            shapes[f"{layer}{LORA_FACTORS[1]}"] = (out, lora.rank)
    return shapes


def check_finetuned_layout(tensors: Mapping[str, TensorInfo], model: Mapping[str, Any], spec: FinetuneSpec) -> bool:
    """A fine-tuned file's tensors are those ``spec`` and ``model`` imply: encoder, LoRA factors, head.

    The encoder's tensors are checked as :func:`bionemo.esm2.hf.layout.check_bionemo_layout` checks them, without
    the language-model head; the LoRA factors (``spec.lora``) and the head's tensors must all be there, of the
    shapes :func:`lora_shapes` and :func:`head_shapes` give, and floating point.

    Returns:
        Whether the optional contact head is there (checked).

    Raises:
        CheckpointError: Missing encoder, LoRA or head tensors (named), LoRA factors the spec has no adapter for,
            head tensors the head does not have, a shape that disagrees, or a tensor that is not floating point.
    """
    contact_head = check_bionemo_layout(tensors, model, padded_vocab=False, lm_head=False)
    lora = lora_shapes(spec.lora, model) if spec.lora is not None else {}
    found = [name for name in tensors if name.endswith(LORA_FACTORS)]
    missing = [name for name in lora if name not in tensors]
    if missing:
        raise CheckpointError(
            f"{len(missing)} LoRA factor(s) are missing for --encoder lora with targets "
            f"{', '.join(spec.lora.targets) if spec.lora else ''}: {listing(missing)}"
        )
    unexpected = [name for name in found if name not in lora]
    if unexpected:
        which = f"targets {', '.join(spec.lora.targets)}" if spec.lora else f"--encoder {spec.encoder}"
        raise CheckpointError(
            f"{len(unexpected)} LoRA factor(s) have no adapter in the fine-tuning metadata ({which}): "
            f"{listing(unexpected)}"
        )
    for name, shape in lora.items():
        check_tensor(name, tensors[name], shape, f"LoRA rank {spec.lora.rank if spec.lora else 0}")
    heads = head_shapes(spec.head, int(model["hidden_size"]), spec.num_outputs)
    present = [name for name in tensors if name.startswith(HEAD_PREFIX)]
    missing = [name for name in heads if name not in tensors]
    if missing:
        raise CheckpointError(
            f"{len(missing)} tensor(s) of the {spec.head.kind} head are missing: {listing(missing)}"
            + ("" if present else f"; the file holds no {HEAD_PREFIX}* tensor at all")
        )
    unexpected = [name for name in present if name not in heads]
    if unexpected:
        raise CheckpointError(
            f"tensor(s) {listing(unexpected)} are not part of a {spec.head.kind} head (its tensors: {', '.join(heads)})"
        )
    why = f"a {spec.head.kind} head with {spec.num_outputs} output(s) on hidden_size {model['hidden_size']}"
    for name, shape in heads.items():
        check_tensor(name, tensors[name], shape, why)
    return contact_head
