"""Fine-tuned models' tensors to and from Hugging Face: classification folders, LoRA merged or as a PEFT adapter.

- :func:`load_hf_finetuned`: an ``EsmFor{Sequence,Token}Classification`` folder -> encoder tensors in bionemo's
  names (no LM head) and the head's under ``head.`` (:mod:`bionemo.esm2.finetune.hf_heads` maps the names).
- :func:`finetuned_to_hf`: a fine-tuned model's tensors -> that model's Hugging Face tensors, each adapted layer's
  LoRA update merged into its weight: ``W + alpha / rank * B @ A`` in megatron's layout, before ``linear_qkv`` is
  split into query/key/value.
- :func:`write_peft_adapter`: the LoRA factors and head as a PEFT adapter (``adapter_config.json``,
  ``adapter_model.safetensors``) for the pretrained encoder the model was fine-tuned from. The fused ``linear_qkv``
  factors become three adapters, ``query``, ``key``, ``value``, sharing ``A``, each with its rows of ``B``
  (``B @ A``'s rows split as the weight's are); ``linear_proj`` -> ``attention.output.dense``, ``linear_fc1`` ->
  ``intermediate.dense``, ``linear_fc2`` -> ``output.dense``; the head is saved whole (``modules_to_save``).
"""

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from bionemo.esm2.finetune.head_config import HeadKind
from bionemo.esm2.finetune.hf_heads import (
    HF_ARCHITECTURES,
    HF_HEAD_PREFIX,
    bionemo_head_name,
    check_hf_head_layout,
    hf_finetuned_config,
    hf_head_name,
)
from bionemo.esm2.finetune.layout import LORA_FACTORS, LORA_MODULES, lora_shapes
from bionemo.esm2.finetune.spec import HEAD_PREFIX, FinetuneSpec
from bionemo.esm2.hf.files import bionemo_to_hf, check_finite, hf_to_bionemo, read_hf_tensors, tensor_info, write_folder
from bionemo.esm2.hf.layout import CheckpointError, read_hf_config

__all__ = [
    "PEFT_TASK_TYPES",
    "finetuned_to_hf",
    "load_hf_finetuned",
    "merged_encoder",
    "peft_adapter",
    "write_peft_adapter",
]

PEFT_TASK_TYPES = {HeadKind.HF_SEQUENCE: "SEQ_CLS", HeadKind.HF_TOKEN: "TOKEN_CLS"}
"""PEFT's ``task_type`` for each head that exports (``PeftModel.from_pretrained`` picks its wrapper by it)."""

_HF_LORA_MODULES = {
    "qkv": ("attention.self.query", "attention.self.key", "attention.self.value"),
    "proj": ("attention.output.dense",),
    "fc1": ("intermediate.dense",),
    "fc2": ("output.dense",),
}
"""LoRA target -> the ``EsmLayer`` modules (transformers' ``modeling_esm``) its update lands in."""

_PEFT_PREFIX = "base_model.model."


def load_hf_finetuned(folder: Path, spec: FinetuneSpec) -> tuple[dict[str, torch.Tensor], dict[str, Any], list[str]]:
    """Read a Hugging Face classification folder whose ``config.json`` gives ``spec``.

    Returns:
        The encoder's bionemo tensors (float32, 33 vocabulary rows, no LM head; the contact head where the folder
        has one) with the head's under ``head.``; the model settings; notes on tensors left out.

    Raises:
        CheckpointError: The folder's weights cannot be read, miss encoder or head tensors, have shapes that
            disagree with ``config.json``, or hold NaN/Inf; the message names the folder.
    """
    model = read_hf_config(folder)
    hf_tensors = read_hf_tensors(folder)
    head = {name: value for name, value in hf_tensors.items() if name.startswith(HF_HEAD_PREFIX)}
    encoder = {name: value for name, value in hf_tensors.items() if name not in head}
    try:
        check_hf_head_layout({name: tensor_info(value) for name, value in head.items()}, spec, model["hidden_size"])
        for name, value in head.items():
            check_finite(name, value)
        tensors, notes = hf_to_bionemo(encoder, model, 33, lm_head=False)
    except CheckpointError as error:
        raise CheckpointError(f"Hugging Face checkpoint {folder}: {error}") from None
    kind = spec.head.kind
    tensors.update(
        {bionemo_head_name(kind, name): value.to(torch.float32).contiguous() for name, value in head.items()}
    )
    return tensors, model, notes


def merged_encoder(
    tensors: Mapping[str, torch.Tensor], model: Mapping[str, Any], spec: FinetuneSpec
) -> dict[str, torch.Tensor]:
    """The encoder's tensors (float32), each adapted layer's weight with ``alpha / rank * B @ A`` added.

    Neither the LoRA factors nor the head are in the result. Without LoRA (``spec.lora`` None) the encoder's
    tensors as they are.
    """
    encoder = {
        name: value.to(torch.float32)
        for name, value in tensors.items()
        if not name.startswith(HEAD_PREFIX) and not name.endswith(LORA_FACTORS)
    }
    if spec.lora is None:
        return encoder
    scale = float(spec.lora.alpha) / spec.lora.rank
    for name in lora_shapes(spec.lora, model):
        if not name.endswith(LORA_FACTORS[0]):
            continue
        layer = name.removesuffix(LORA_FACTORS[0])
        a = tensors[name].to(torch.float32)
        b = tensors[layer + LORA_FACTORS[1]].to(torch.float32)
        encoder[f"{layer}.weight"] = encoder[f"{layer}.weight"] + scale * (b @ a)
    return encoder


def finetuned_to_hf(
    tensors: Mapping[str, torch.Tensor], model: Mapping[str, Any], spec: FinetuneSpec
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The ``EsmFor{Sequence,Token}Classification`` tensors (LoRA merged) and ``config.json`` of a fine-tuned model.

    Args:
        tensors: The fine-tuned file's tensors (:class:`~bionemo.esm2.checkpoints.load.LoadedCheckpoint`'s, checked).
        model: bionemo model settings.
        spec: The fine-tuned model (an ``hf`` head).

    Raises:
        ValueError: A head Hugging Face has no model for.
        CheckpointError: What :func:`bionemo.esm2.hf.files.bionemo_to_hf` raises (a ``rotary_base`` other than 10000).
    """
    config = hf_finetuned_config(model, spec)
    hf = bionemo_to_hf(merged_encoder(tensors, model, spec), model, lm_head=False)
    kind = spec.head.kind
    for name, value in tensors.items():
        if name.startswith(HEAD_PREFIX):
            hf[hf_head_name(kind, name)] = value.detach().to(torch.float32).contiguous()
    return hf, config


def peft_adapter(
    tensors: Mapping[str, torch.Tensor], model: Mapping[str, Any], spec: FinetuneSpec
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``adapter_config.json``'s settings and ``adapter_model.safetensors``' tensors of a LoRA fine-tuned model.

    The adapter applies to ``EsmFor{Sequence,Token}Classification.from_pretrained(base, num_labels=n)`` of the
    pretrained encoder the model was fine-tuned from (its base weights are the file's, unmerged).

    Raises:
        ValueError: A model without LoRA (``--encoder`` other than lora), or a head Hugging Face has no model for.
    """
    if spec.lora is None:
        raise ValueError(f"a PEFT adapter needs a model fine-tuned with --encoder lora, not --encoder {spec.encoder}")
    if spec.head.kind not in HF_ARCHITECTURES:
        raise ValueError(f"a {spec.head.kind} head has no Hugging Face model; heads that export: hf-sequence, hf-token")
    h, n = int(model["hidden_size"]), int(model["num_attention_heads"])
    d = h // n
    adapter: dict[str, torch.Tensor] = {}
    for i in range(int(model["num_layers"])):
        for target in spec.lora.targets:
            layer = f"decoder.layers.{i}.{LORA_MODULES[target]}"
            a = tensors[layer + LORA_FACTORS[0]].detach().to(torch.float32)
            b = tensors[layer + LORA_FACTORS[1]].detach().to(torch.float32)
            modules = _HF_LORA_MODULES[target]
            # megatron's linear_qkv rows: per head q_j, k_j, v_j (d rows each), as hf.bionemo_to_hf splits them
            parts = b.reshape(n, 3, d, -1).unbind(1) if target == "qkv" else (b,)
            for module, rows in zip(modules, parts, strict=True):
                key = f"{_PEFT_PREFIX}esm.encoder.layer.{i}.{module}"
                adapter[f"{key}.lora_A.weight"] = a.clone()
                adapter[f"{key}.lora_B.weight"] = rows.reshape(-1, spec.lora.rank).contiguous()
    for name, value in tensors.items():
        if name.startswith(HEAD_PREFIX):
            adapter[_PEFT_PREFIX + hf_head_name(spec.head.kind, name)] = value.detach().to(torch.float32).contiguous()
    modules = "|".join(module.replace(".", r"\.") for t in spec.lora.targets for module in _HF_LORA_MODULES[t])
    config = {
        "peft_type": "LORA",
        "task_type": PEFT_TASK_TYPES[spec.head.kind],
        "r": spec.lora.rank,
        "lora_alpha": float(spec.lora.alpha),
        "lora_dropout": float(spec.lora.dropout),
        # a regular expression, matched whole: "output.dense" alone would also name attention.output.dense
        "target_modules": rf"esm\.encoder\.layer\.\d+\.({modules})",
        "modules_to_save": [HF_HEAD_PREFIX.rstrip(".")],
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "base_model_name_or_path": None,
        "revision": None,
    }
    return config, adapter


def write_peft_adapter(
    folder: Path,
    tensors: Mapping[str, torch.Tensor],
    model: Mapping[str, Any],
    spec: FinetuneSpec,
    force: bool = False,
) -> Path:
    """Write :func:`peft_adapter`'s ``adapter_config.json`` and ``adapter_model.safetensors`` into ``folder``.

    Written whole or not at all (``bionemo.esm2.hf.files.write_folder``).

    Raises:
        ValueError: What :func:`peft_adapter` raises.
        CheckpointError: ``folder`` exists and is not a folder, or is not empty and ``force`` is false.
    """
    config, adapter = peft_adapter(tensors, model, spec)

    def write(tmp: Path) -> None:
        save_file(adapter, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    return write_folder(folder, write, force=force)
