"""Hugging Face ESM-2 folders without their tensors: ``config.json``, and the names and shapes of the tensors.

Standard library only, so that a ``--checkpoint`` is checked (``bionemo.esm2.checkpoints.header``) before torch
is imported. :mod:`bionemo.esm2.hf.files` reads and converts the tensors themselves; its docstring maps the names.
"""

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from bionemo.esm2.catalog import ESM_DEFAULTS
from bionemo.esm2.tokenizer import ESM_TOKENS

__all__ = [
    "ESM_VOCAB",
    "HF_ROTARY_BASE",
    "HF_WEIGHT_FILES",
    "MASK_TOKEN_ID",
    "PAD_TOKEN_ID",
    "VOCAB_SIZE",
    "CONTACT_HEAD",
    "CheckpointError",
    "TensorInfo",
    "bionemo_shapes",
    "check_bionemo_layout",
    "check_contact_head",
    "check_hf_layout",
    "check_tensor",
    "contact_head_shapes",
    "hf_config",
    "hf_index_shards",
    "hf_names",
    "hf_pairs",
    "hf_rotary_base",
    "hf_shapes",
    "is_hf_folder",
    "listing",
    "padded_vocab_size",
    "read_config_json",
    "read_hf_config",
]

ESM_VOCAB = ESM_TOKENS
"""ESM-2's 33 tokens in id order (Hugging Face's ``vocab.txt``)."""

VOCAB_SIZE = len(ESM_VOCAB)
PAD_TOKEN_ID = ESM_VOCAB.index("<pad>")
MASK_TOKEN_ID = ESM_VOCAB.index("<mask>")

HF_ROTARY_BASE = 10000.0
"""The one rotary base of Hugging Face's ESM-2: ``EsmConfig`` has no setting for it, and ``EsmForMaskedLM``'s
rotary embeddings (transformers' ``RotaryEmbedding``) compute their inverse frequencies with base 10000."""

HF_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""Weight files of a Hugging Face folder, in the order they are looked for."""

CONTACT_HEAD = ("contact_head.regression.weight", "contact_head.regression.bias")
"""The contact head's tensors, by the same names in bionemo files and (after ``esm.``) in Hugging Face folders:
``EsmContactPredictionHead``'s logistic regression over the ``num_layers * num_attention_heads`` attention maps.
Optional on both sides: a model without them predicts everything but contacts."""

_SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
_SHOWN = 10


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: the message names the file or folder, what is wrong and what is valid."""


def listing(names: Iterable[str], limit: int = _SHOWN) -> str:
    """The first ``limit`` of ``names``, comma-separated, and how many more there are (for error messages)."""
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def padded_vocab_size(vocab_size: int, tensor_parallel: int = 1) -> int:
    """``vocab_size`` rounded up to a multiple of ``8 * tensor_parallel`` (megatron's vocab-parallel padding).

    Raises:
        ValueError: For a vocabulary size or tensor-parallel size below 1.
    """
    if vocab_size < 1 or tensor_parallel < 1:
        raise ValueError(f"vocab_size ({vocab_size}) and tensor_parallel ({tensor_parallel}) must be at least 1")
    multiple = 8 * tensor_parallel
    return -(-vocab_size // multiple) * multiple


def is_hf_folder(path: Path) -> bool:
    """Whether ``path`` is a directory (a Hugging Face checkpoint is a folder; bionemo weights are one file)."""
    return Path(path).is_dir()


# --------------------------------------------------------------------------------------------------- config


def read_hf_config(folder: Path) -> dict[str, Any]:
    """The bionemo model settings of a Hugging Face ESM-2 folder's ``config.json``.

    Args:
        folder: A folder saved by ``EsmForMaskedLM.save_pretrained`` (or downloaded from the hub).

    Returns:
        ``num_layers, hidden_size, num_attention_heads, ffn_hidden_size, seq_length, layernorm_epsilon,
        token_dropout, hidden_dropout, attention_dropout, vocab_size`` and ``rotary_base`` (always
        :data:`HF_ROTARY_BASE`). Settings the file leaves out take ``EsmConfig``'s defaults, as ``transformers``
        would.

    Raises:
        CheckpointError: No ``config.json``, unreadable JSON, another ``model_type`` than ``"esm"``, positions
            other than rotary (ESM-1), ``emb_layer_norm_before``, a folding model (ESMFold), a vocabulary other
            than ESM-2's 33 tokens, missing or non-positive shape settings, or a hidden size that the heads do
            not divide.
    """
    path = Path(folder) / "config.json"
    config = read_config_json(path)
    _check_esm2_kind(path, config)
    hidden, heads, seq_length = _checked_shape(path, config)
    settings = _checked_rates(path, config)
    return {
        "num_layers": config["num_hidden_layers"],
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "ffn_hidden_size": config["intermediate_size"],
        "seq_length": seq_length,
        "layernorm_epsilon": settings["layer_norm_eps"],
        "token_dropout": bool(config.get("token_dropout", False)),
        "hidden_dropout": settings["hidden_dropout_prob"],
        "attention_dropout": settings["attention_probs_dropout_prob"],
        "vocab_size": VOCAB_SIZE,
        "rotary_base": HF_ROTARY_BASE,
    }


def read_config_json(path: Path) -> dict[str, Any]:
    """The settings of the ``config.json`` at ``path``.

    Raises:
        CheckpointError: No such file, unreadable JSON, or JSON that is not an object.
    """
    if not path.is_file():
        raise CheckpointError(
            f"Hugging Face folder {path.parent} has no config.json; an ESM-2 folder needs config.json and "
            f"model.safetensors or pytorch_model.bin"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} cannot be read as JSON: {error}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} holds a JSON {type(config).__name__}, not an object of settings")
    return config


def _check_esm2_kind(path: Path, config: Mapping[str, Any]) -> None:
    """Refuse what is not an ESM-2 language model: other model types, ESM-1 positions, ESMFold, other vocabularies."""
    model_type = config.get("model_type")
    if model_type != "esm":
        raise CheckpointError(
            f"{path} has model_type {model_type!r}; only ESM-2 models (model_type 'esm', EsmForMaskedLM) are supported"
        )
    positions = config.get("position_embedding_type", "absolute")
    if positions != "rotary":
        raise CheckpointError(
            f"{path} has position_embedding_type {positions!r}; only 'rotary' (ESM-2) is supported, ESM-1 style "
            "absolute or relative positions are not"
        )
    if config.get("emb_layer_norm_before"):
        raise CheckpointError(
            f"{path} has emb_layer_norm_before true (ESM-1b); ESM-2 models have no layer norm before the encoder"
        )
    if config.get("is_folding_model"):
        raise CheckpointError(f"{path} is a folding model (ESMFold); only ESM-2 language models are supported")
    vocab = config.get("vocab_size")
    if vocab != VOCAB_SIZE:
        raise CheckpointError(f"{path} has vocab_size {vocab!r}; ESM-2's vocabulary has {VOCAB_SIZE} tokens")


def _checked_shape(path: Path, config: Mapping[str, Any]) -> tuple[int, int, int]:
    """``(hidden_size, num_attention_heads, max_position_embeddings)``, after checking every shape setting."""
    for key in _SHAPE_KEYS:
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{path} has {key} {value!r}; it must be a positive integer")
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    if hidden % heads:
        raise CheckpointError(
            f"{path}: hidden_size {hidden} is not divisible by num_attention_heads {heads}; each head needs "
            "hidden_size / num_attention_heads dimensions"
        )
    if (hidden // heads) % 2:
        raise CheckpointError(
            f"{path}: head dimension hidden_size / num_attention_heads = {hidden // heads} is odd; rotary "
            "embeddings need an even one"
        )
    seq_length = config.get("max_position_embeddings", 1026)
    if isinstance(seq_length, bool) or not isinstance(seq_length, int) or seq_length < 3:
        raise CheckpointError(f"{path} has max_position_embeddings {seq_length!r}; it must be an integer above 2")
    return hidden, heads, seq_length


def _checked_rates(path: Path, config: Mapping[str, Any]) -> dict[str, float]:
    """The layer-norm epsilon and dropout rates, ``EsmConfig``'s defaults where the file leaves them out."""
    settings = {"layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
    for key, default in settings.items():
        value = config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise CheckpointError(f"{path} has {key} {value!r}; it must be a non-negative number")
        settings[key] = float(value)
    return settings


def hf_rotary_base(model: Mapping[str, Any]) -> float:
    """``model``'s ``rotary_base`` (``ESM2Config``'s default where absent), if Hugging Face's ESM-2 can hold it.

    Raises:
        CheckpointError: Another base than :data:`HF_ROTARY_BASE`. ``config.json`` cannot say it (``EsmConfig``
            has no such setting): a model built from that config, and ``bionemo convert from-hf``, use 10000.
    """
    base = model.get("rotary_base", HF_ROTARY_BASE)
    if isinstance(base, bool) or not isinstance(base, int | float) or float(base) != HF_ROTARY_BASE:
        raise CheckpointError(
            f"the model has rotary_base {base!r}; Hugging Face's ESM-2 supports rotary base {HF_ROTARY_BASE:g} only "
            f"(transformers' EsmConfig has no rotary base setting and EsmForMaskedLM builds its rotary embeddings "
            f"with base {HF_ROTARY_BASE:g}), so only models with rotary_base {HF_ROTARY_BASE:g} convert to it"
        )
    return HF_ROTARY_BASE


def hf_config(model: Mapping[str, Any]) -> dict[str, Any]:
    """The ``config.json`` of an ``EsmForMaskedLM`` with bionemo settings ``model``.

    Raises:
        KeyError: When ``model`` lacks one of the shape settings.
        CheckpointError: A ``rotary_base`` Hugging Face cannot hold (:func:`hf_rotary_base`).
    """
    hf_rotary_base(model)
    model = {**ESM_DEFAULTS, **model}  # older bionemo files omit some of ESM-2's settings
    return {
        "architectures": ["EsmForMaskedLM"],
        "model_type": "esm",
        "attention_probs_dropout_prob": float(model["attention_dropout"]),
        "hidden_dropout_prob": float(model["hidden_dropout"]),
        "emb_layer_norm_before": False,
        "esmfold_config": None,
        "hidden_act": "gelu",
        "hidden_size": int(model["hidden_size"]),
        "initializer_range": 0.02,
        "intermediate_size": int(model["ffn_hidden_size"]),
        "is_folding_model": False,
        "layer_norm_eps": float(model["layernorm_epsilon"]),
        "mask_token_id": MASK_TOKEN_ID,
        "max_position_embeddings": int(model["seq_length"]),
        "num_attention_heads": int(model["num_attention_heads"]),
        "num_hidden_layers": int(model["num_layers"]),
        "pad_token_id": PAD_TOKEN_ID,
        "position_embedding_type": "rotary",
        "tie_word_embeddings": True,
        "token_dropout": bool(model["token_dropout"]),
        "torch_dtype": "float32",
        "dtype": "float32",
        "use_cache": True,
        "vocab_list": None,
        "vocab_size": VOCAB_SIZE,
    }


# --------------------------------------------------------------------------------------------------- tensors


class TensorInfo(NamedTuple):
    """What the checks need of a tensor: its type as torch prints it, its shape, whether it is floating point."""

    dtype: str
    shape: tuple[int, ...]
    floating_point: bool


def hf_pairs(num_layers: int, lm_head: bool = True) -> list[tuple[str, str]]:
    """(bionemo name, Hugging Face name without ``esm.``) of every tensor copied one to one (``lm_head``: its too)."""
    pairs = [("decoder.final_layernorm", "encoder.emb_layer_norm_after")]
    for i in range(num_layers):
        ours, theirs = f"decoder.layers.{i}.", f"encoder.layer.{i}."
        pairs += [
            (f"{ours}input_layernorm", f"{theirs}attention.LayerNorm"),
            (f"{ours}self_attention.linear_proj", f"{theirs}attention.output.dense"),
            (f"{ours}pre_mlp_layernorm", f"{theirs}LayerNorm"),
            (f"{ours}mlp.linear_fc1", f"{theirs}intermediate.dense"),
            (f"{ours}mlp.linear_fc2", f"{theirs}output.dense"),
        ]
    if lm_head:
        pairs += [("lm_head.dense", "lm_head.dense"), ("lm_head.layer_norm", "lm_head.layer_norm")]
    return [(f"{a}.{kind}", f"{b}.{kind}") for a, b in pairs for kind in ("weight", "bias")]


def hf_shapes(model: Mapping[str, Any], lm_head: bool = True) -> dict[str, tuple[int, ...]]:
    """Hugging Face name (without ``esm.`` for the encoder) -> shape, for every tensor the model needs.

    Without ``lm_head``, the encoder's only (``EsmModel``'s, as in ``EsmFor{Sequence,Token}Classification``).
    """
    h, f, layers = int(model["hidden_size"]), int(model["ffn_hidden_size"]), int(model["num_layers"])
    shapes: dict[str, tuple[int, ...]] = {"embeddings.word_embeddings.weight": (VOCAB_SIZE, h)}
    for i in range(layers):
        layer = f"encoder.layer.{i}."
        for part in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            shapes[f"{layer}{part}.weight"], shapes[f"{layer}{part}.bias"] = (h, h), (h,)
        for norm in ("attention.LayerNorm", "LayerNorm"):
            shapes[f"{layer}{norm}.weight"] = shapes[f"{layer}{norm}.bias"] = (h,)
        shapes[f"{layer}intermediate.dense.weight"], shapes[f"{layer}intermediate.dense.bias"] = (f, h), (f,)
        shapes[f"{layer}output.dense.weight"], shapes[f"{layer}output.dense.bias"] = (h, f), (h,)
    shapes["encoder.emb_layer_norm_after.weight"] = shapes["encoder.emb_layer_norm_after.bias"] = (h,)
    if lm_head:
        shapes["lm_head.layer_norm.weight"] = shapes["lm_head.layer_norm.bias"] = (h,)
        shapes["lm_head.dense.weight"], shapes["lm_head.dense.bias"] = (h, h), (h,)
        shapes["lm_head.bias"] = (VOCAB_SIZE,)
    return shapes


def contact_head_shapes(model: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the contact head's tensors (:data:`CONTACT_HEAD`): ``[1, layers * heads]`` and ``[1]``."""
    weight, bias = CONTACT_HEAD
    return {weight: (1, int(model["num_layers"]) * int(model["num_attention_heads"])), bias: (1,)}


def check_contact_head(found: Mapping[str, str], tensors: Mapping[str, TensorInfo], model: Mapping[str, Any]) -> bool:
    """Whether the contact head is there (both tensors, floating point, of the shapes ``model`` implies).

    Args:
        found: Contact-head name (:data:`CONTACT_HEAD`) -> the name in ``tensors``, for those present.
        tensors: What is known of each tensor, by its name there.
        model: bionemo model settings.

    Raises:
        CheckpointError: One of the two tensors without the other, a shape that disagrees with ``model``, or a
            tensor that is not floating point.
    """
    present = [name for name in CONTACT_HEAD if name in found]
    if not present:
        return False
    if len(present) < len(CONTACT_HEAD):
        missing = next(name for name in CONTACT_HEAD if name not in found)
        raise CheckpointError(
            f"the contact head is incomplete: {found[present[0]]} is there, {missing} is not; a checkpoint holds "
            "both contact-head tensors or neither"
        )
    for name, shape in contact_head_shapes(model).items():
        check_tensor(
            found[name], tensors[found[name]], shape, f"one weight per layer and attention head: {_config_text(model)}"
        )
    return True


def check_tensor(name: str, info: TensorInfo, shape: tuple[int, ...], why: str) -> None:
    """``name``'s tensor has ``shape`` (``why``: the config it follows from) and a floating-point type."""
    if info.shape != shape:
        raise CheckpointError(f"tensor {name} has shape {info.shape}, the config needs {shape} ({why})")
    if not info.floating_point:
        raise CheckpointError(f"tensor {name} has dtype {info.dtype}; model weights are floating point")


def _config_text(model: Mapping[str, Any]) -> str:
    return (
        f"num_hidden_layers={model['num_layers']}, hidden_size={model['hidden_size']}, "
        f"num_attention_heads={model['num_attention_heads']}, intermediate_size={model['ffn_hidden_size']}"
    )


def bionemo_shapes(model: Mapping[str, Any], *, lm_head: bool = True) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every whole bionemo tensor of an ESM-2 with ``model`` settings (33 vocabulary rows).

    Without ``lm_head``, the encoder's only: no ``lm_head.*`` nor ``output_layer.bias`` (a fine-tuned model's).
    """
    h = int(model["hidden_size"])
    shapes: dict[str, tuple[int, ...]] = {"embedding.word_embeddings.weight": (VOCAB_SIZE, h)}
    hf = hf_shapes(model, lm_head)
    for i in range(int(model["num_layers"])):
        shapes[f"decoder.layers.{i}.self_attention.linear_qkv.weight"] = (3 * h, h)
        shapes[f"decoder.layers.{i}.self_attention.linear_qkv.bias"] = (3 * h,)
    for mine, theirs in hf_pairs(int(model["num_layers"]), lm_head):
        shapes[mine] = hf[theirs]
    if lm_head:
        shapes["output_layer.bias"] = (VOCAB_SIZE,)
    return shapes


def hf_names(names: Iterable[str]) -> dict[str, str]:
    """Hugging Face tensor name without the ``esm.`` prefix of ``EsmForMaskedLM`` -> the name in the file."""
    found: dict[str, str] = {}
    for name in names:
        found.setdefault(name.removeprefix("esm."), name)
    return found


def check_hf_layout(
    tensors: Mapping[str, TensorInfo], model: Mapping[str, Any], *, lm_head: bool = True
) -> dict[str, str]:
    """Every Hugging Face tensor ``model`` needs is there, floating point and of the shape the config implies.

    Args:
        tensors: Hugging Face names (with or without ``esm.``) and what is known of each tensor.
        model: bionemo model settings, as :func:`read_hf_config` returns them.
        lm_head: Whether the language-model head is needed (``EsmForMaskedLM``); without it, the encoder's
            tensors only (``EsmFor{Sequence,Token}Classification``, whose head is checked apart).

    Returns:
        :func:`hf_names` of ``tensors``.

    Raises:
        CheckpointError: Missing tensors (named), a tensor whose shape disagrees with the config, or a tensor
            that is not floating point; the same for the optional contact head (:func:`check_contact_head`).
    """
    found = hf_names(tensors)
    prefixed = not tensors or any(name.startswith("esm.") for name in tensors)

    def shown(base: str) -> str:
        if base in found:
            return found[base]
        return f"esm.{base}" if prefixed and not base.startswith("lm_head.") else base

    shapes = hf_shapes(model, lm_head)
    missing = [shown(name) for name in shapes if name not in found]
    if missing:
        kind = "an EsmForMaskedLM" if lm_head else "an ESM-2 encoder"
        raise CheckpointError(
            f"{len(missing)} Hugging Face tensor(s) are missing for {kind} with {_config_text(model)}: "
            f"{listing(missing)}"
        )
    for name, shape in shapes.items():
        check_tensor(found[name], tensors[found[name]], shape, f"config.json: {_config_text(model)}")
    check_contact_head(found, tensors, model)
    return found


def check_bionemo_layout(
    tensors: Mapping[str, TensorInfo], model: Mapping[str, Any], *, padded_vocab: bool = True, lm_head: bool = True
) -> bool:
    """Every bionemo tensor ``model`` needs is there, floating point and of the shape it implies.

    Returns:
        Whether the optional contact head (:data:`CONTACT_HEAD`) is there too, checked the same way.

    Args:
        tensors: Whole bionemo tensors' names and what is known of each.
        model: bionemo model settings.
        padded_vocab: Accept more than 33 vocabulary rows (megatron's padding), as a model's state holds them.
        lm_head: Whether the language-model head is needed (a fine-tuned model's encoder has none).

    Raises:
        CheckpointError: Missing tensors (named), a tensor whose shape disagrees with ``model``, or a tensor that
            is not floating point (also of a contact head: :func:`check_contact_head`).
    """
    shapes = bionemo_shapes(model, lm_head=lm_head)
    missing = [name for name in shapes if name not in tensors]
    if missing:
        raise CheckpointError(f"{len(missing)} bionemo tensor(s) are missing: {listing(missing)}")
    for name, shape in shapes.items():
        info = tensors[name]
        found = info.shape
        vocab_rows = padded_vocab and name in ("embedding.word_embeddings.weight", "output_layer.bias")
        if found != shape and not (vocab_rows and found[1:] == shape[1:] and found[0] >= VOCAB_SIZE):
            raise CheckpointError(f"tensor {name} has shape {found}, the config needs {shape} ({_config_text(model)})")
        if not info.floating_point:
            raise CheckpointError(f"tensor {name} has dtype {info.dtype}; model weights are floating point")
    return check_contact_head({name: name for name in CONTACT_HEAD if name in tensors}, tensors, model)


def hf_index_shards(index: Path) -> list[Path]:
    """The shard files a ``*.index.json`` of a Hugging Face folder names, each once, in order of first mention.

    Raises:
        CheckpointError: An index that is not JSON with a ``weight_map`` object, or that names a shard outside its
            folder or missing from it.
    """
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise CheckpointError(
            f"{index} cannot be read: {error}; a shard index is JSON with a weight_map of tensor name -> shard file"
        ) from None
    shards = []
    for shard in dict.fromkeys(weight_map.values()):
        path = index.parent / str(shard)
        if Path(str(shard)).is_absolute() or ".." in Path(str(shard)).parts:
            raise CheckpointError(f"{index} names shard {shard!r} outside its folder")
        if not path.is_file():
            raise CheckpointError(f"{index} names shard {shard}, which is not in {index.parent}")
        shards.append(path)
    return shards
