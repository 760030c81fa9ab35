"""Hugging Face ESM-2 folders (``transformers.EsmForMaskedLM``) to and from bionemo's megatron-core tensors.

Reads and writes the files themselves (``config.json``, safetensors or ``pytorch_model.bin``, tokenizer files)
without importing ``transformers``. bionemo tensors are whole (unsharded) megatron-core names:

=====================================================  ================================================
bionemo (megatron-core)                                Hugging Face (``EsmForMaskedLM``)
=====================================================  ================================================
``embedding.word_embeddings.weight`` ``[Vp, h]``        ``esm.embeddings.word_embeddings.weight`` ``[33, h]``
``decoder.layers.{i}.input_layernorm``                  ``esm.encoder.layer.{i}.attention.LayerNorm``
``decoder.layers.{i}.self_attention.linear_qkv``        ``...attention.self.query|key|value`` (per head)
``decoder.layers.{i}.self_attention.linear_proj``       ``...attention.output.dense``
``decoder.layers.{i}.pre_mlp_layernorm``                ``esm.encoder.layer.{i}.LayerNorm``
``decoder.layers.{i}.mlp.linear_fc1``                   ``...intermediate.dense``
``decoder.layers.{i}.mlp.linear_fc2``                   ``...output.dense``
``decoder.final_layernorm``                             ``esm.encoder.emb_layer_norm_after``
``lm_head.dense`` / ``lm_head.layer_norm``              ``lm_head.dense`` / ``lm_head.layer_norm``
``output_layer.bias`` ``[Vp]``                          ``lm_head.bias`` ``[33]``
=====================================================  ================================================

megatron's fused ``linear_qkv`` holds, for each head ``j``, the ``d`` rows of ``q_j``, then of ``k_j``, then of
``v_j`` (``d = h / n``). The output projection is tied to the word embeddings on both sides, so Hugging Face's
``lm_head.decoder.weight`` is never read nor written.
"""

import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from bionemo.esm2.tokenizer import ESM_TOKENS

__all__ = [
    "ESM_VOCAB",
    "HF_WEIGHT_FILES",
    "CheckpointError",
    "bionemo_shapes",
    "bionemo_to_hf",
    "check_bionemo_tensors",
    "hf_config",
    "hf_to_bionemo",
    "is_hf_folder",
    "load_hf_checkpoint",
    "padded_vocab_size",
    "read_hf_config",
    "read_hf_tensors",
    "write_hf_folder",
]

ESM_VOCAB = ESM_TOKENS
"""ESM-2's 33 tokens in id order (Hugging Face's ``vocab.txt``)."""

VOCAB_SIZE = len(ESM_VOCAB)
PAD_TOKEN_ID = ESM_VOCAB.index("<pad>")
MASK_TOKEN_ID = ESM_VOCAB.index("<mask>")

HF_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""Weight files of a Hugging Face folder, in the order they are looked for."""

_SPECIAL_TOKENS = {
    "cls_token": "<cls>",
    "eos_token": "<eos>",
    "mask_token": "<mask>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
}
_SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
_SHOWN = 10


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: the message names the file or folder, what is wrong and what is valid."""


def _listing(names: Iterable[str], limit: int = _SHOWN) -> str:
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
        token_dropout, hidden_dropout, attention_dropout, vocab_size``. Settings the file leaves out take
        ``EsmConfig``'s defaults, as ``transformers`` would.

    Raises:
        CheckpointError: No ``config.json``, unreadable JSON, another ``model_type`` than ``"esm"``, positions
            other than rotary (ESM-1), ``emb_layer_norm_before``, a folding model (ESMFold), a vocabulary other
            than ESM-2's 33 tokens, missing or non-positive shape settings, or a hidden size that the heads do
            not divide.
    """
    folder = Path(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(
            f"Hugging Face folder {folder} has no config.json; an ESM-2 folder needs config.json and "
            f"model.safetensors or pytorch_model.bin"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} cannot be read as JSON: {error}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} holds a JSON {type(config).__name__}, not an object of settings")
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
    settings = {
        "layer_norm_eps": 1e-12,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
    }
    for key, default in settings.items():
        value = config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise CheckpointError(f"{path} has {key} {value!r}; it must be a non-negative number")
        settings[key] = float(value)
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
    }


def hf_config(model: Mapping[str, Any]) -> dict[str, Any]:
    """The ``config.json`` of an ``EsmForMaskedLM`` with bionemo settings ``model``.

    Raises:
        KeyError: When ``model`` lacks one of the shape settings.
    """
    return {
        "architectures": ["EsmForMaskedLM"],
        "model_type": "esm",
        "attention_probs_dropout_prob": float(model.get("attention_dropout", 0.0)),
        "hidden_dropout_prob": float(model.get("hidden_dropout", 0.0)),
        "emb_layer_norm_before": False,
        "esmfold_config": None,
        "hidden_act": "gelu",
        "hidden_size": int(model["hidden_size"]),
        "initializer_range": 0.02,
        "intermediate_size": int(model["ffn_hidden_size"]),
        "is_folding_model": False,
        "layer_norm_eps": float(model.get("layernorm_epsilon", 1e-5)),
        "mask_token_id": MASK_TOKEN_ID,
        "max_position_embeddings": int(model.get("seq_length", 1026)),
        "num_attention_heads": int(model["num_attention_heads"]),
        "num_hidden_layers": int(model["num_layers"]),
        "pad_token_id": PAD_TOKEN_ID,
        "position_embedding_type": "rotary",
        "tie_word_embeddings": True,
        "token_dropout": bool(model.get("token_dropout", True)),
        "torch_dtype": "float32",
        "dtype": "float32",
        "use_cache": True,
        "vocab_list": None,
        "vocab_size": VOCAB_SIZE,
    }


# --------------------------------------------------------------------------------------------------- tensors


def _load_file(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.name.endswith(".safetensors"):
            tensors = load_file(str(path))
        else:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # SafetensorError, OSError, pickle.UnpicklingError, RuntimeError of a damaged file
        raise CheckpointError(f"{path} cannot be read (truncated or corrupted?): {error}") from None
    if not isinstance(tensors, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()
    ):
        raise CheckpointError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return dict(tensors)


def _load_index(index: Path) -> dict[str, torch.Tensor]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise CheckpointError(
            f"{index} cannot be read: {error}; a shard index is JSON with a weight_map of tensor name -> shard file"
        ) from None
    tensors: dict[str, torch.Tensor] = {}
    for shard in dict.fromkeys(weight_map.values()):
        path = index.parent / str(shard)
        if Path(str(shard)).is_absolute() or ".." in Path(str(shard)).parts:
            raise CheckpointError(f"{index} names shard {shard!r} outside its folder")
        if not path.is_file():
            raise CheckpointError(f"{index} names shard {shard}, which is not in {index.parent}")
        tensors.update(_load_file(path))
    return tensors


def read_hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face folder, by its name there, on the CPU and in its stored dtype.

    Looks for ``model.safetensors``, ``model.safetensors.index.json`` (+ its shards), ``pytorch_model.bin`` and
    ``pytorch_model.bin.index.json`` (+ its shards), in that order; ``.bin`` files load with ``weights_only``.

    Raises:
        CheckpointError: None of those files, a file that cannot be read (truncated, corrupted, not a state
            dict), or an index that names a missing shard.
    """
    folder = Path(folder)
    for name in HF_WEIGHT_FILES:
        path = folder / name
        if path.is_file():
            return _load_index(path) if name.endswith(".index.json") else _load_file(path)
    raise CheckpointError(f"Hugging Face folder {folder} has no weights; it needs one of {', '.join(HF_WEIGHT_FILES)}")


def _hf_pairs(num_layers: int) -> list[tuple[str, str]]:
    """(bionemo name, Hugging Face name without ``esm.``) of every tensor copied one to one."""
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
    pairs += [("lm_head.dense", "lm_head.dense"), ("lm_head.layer_norm", "lm_head.layer_norm")]
    return [(f"{a}.{kind}", f"{b}.{kind}") for a, b in pairs for kind in ("weight", "bias")]


def _hf_shapes(model: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Hugging Face name (without ``esm.`` for the encoder) -> shape, for every tensor the model needs."""
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
    for norm in ("encoder.emb_layer_norm_after", "lm_head.layer_norm"):
        shapes[f"{norm}.weight"] = shapes[f"{norm}.bias"] = (h,)
    shapes["lm_head.dense.weight"], shapes["lm_head.dense.bias"] = (h, h), (h,)
    shapes["lm_head.bias"] = (VOCAB_SIZE,)
    return shapes


def _ignored_kind(name: str) -> str | None:
    """Why a Hugging Face tensor (name without ``esm.``) is known and not needed, or None."""
    if name.startswith("contact_head."):
        return "contact head"
    if name.endswith(".rotary_embeddings.inv_freq"):
        return "rotary inv_freq buffers (recomputed)"
    if name == "embeddings.position_ids":
        return "position_ids buffer"
    if name == "lm_head.decoder.weight":
        return "lm_head.decoder.weight (tied to the word embeddings)"
    return None


def _config_text(model: Mapping[str, Any]) -> str:
    return (
        f"num_hidden_layers={model['num_layers']}, hidden_size={model['hidden_size']}, "
        f"num_attention_heads={model['num_attention_heads']}, intermediate_size={model['ffn_hidden_size']}"
    )


def _check_finite(name: str, value: torch.Tensor) -> None:
    if not bool(torch.isfinite(value).all()):
        raise CheckpointError(f"tensor {name} holds NaN or Inf values; the checkpoint is damaged")


def hf_to_bionemo(
    hf_tensors: Mapping[str, torch.Tensor], model: Mapping[str, Any], padded_vocab_size: int
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Whole bionemo tensors (float32, contiguous, vocabulary padded with zeros) from Hugging Face ESM-2 tensors.

    Args:
        hf_tensors: Hugging Face names, with or without the ``esm.`` prefix of ``EsmForMaskedLM``.
        model: bionemo model settings, as :func:`read_hf_config` returns them.
        padded_vocab_size: Rows of the word embeddings and entries of the output bias (at least 33; see
            :func:`padded_vocab_size`).

    Returns:
        The tensors and one-line notes on tensors left out (contact head, rotary buffers, unknown names).

    Raises:
        CheckpointError: Missing tensors (named), a tensor whose shape disagrees with the config, a tensor
            that is not floating point, or NaN/Inf values.
        ValueError: ``padded_vocab_size`` below 33.
    """
    if padded_vocab_size < VOCAB_SIZE:
        raise ValueError(f"padded_vocab_size {padded_vocab_size} is below ESM-2's {VOCAB_SIZE} tokens")
    found: dict[str, str] = {}  # name without "esm." -> name in the file
    for name in hf_tensors:
        found.setdefault(name.removeprefix("esm."), name)
    prefixed = not hf_tensors or any(name.startswith("esm.") for name in hf_tensors)

    def shown(base: str) -> str:
        if base in found:
            return found[base]
        return f"esm.{base}" if prefixed and not base.startswith("lm_head.") else base

    shapes = _hf_shapes(model)
    missing = [shown(name) for name in shapes if name not in found]
    if missing:
        raise CheckpointError(
            f"{len(missing)} Hugging Face tensor(s) are missing for an EsmForMaskedLM with {_config_text(model)}: "
            f"{_listing(missing)}"
        )
    for name, shape in shapes.items():
        value = hf_tensors[found[name]]
        if tuple(value.shape) != shape:
            raise CheckpointError(
                f"tensor {found[name]} has shape {tuple(value.shape)}, the config needs {shape} "
                f"(config.json: {_config_text(model)})"
            )
        if not value.is_floating_point():
            raise CheckpointError(f"tensor {found[name]} has dtype {value.dtype}; model weights are floating point")
        _check_finite(found[name], value)

    def get(base: str) -> torch.Tensor:
        return hf_tensors[found[base]].detach().to("cpu", torch.float32)

    h, n = int(model["hidden_size"]), int(model["num_attention_heads"])
    d = h // n
    ours: dict[str, torch.Tensor] = {}
    embeddings = torch.zeros(padded_vocab_size, h)
    embeddings[:VOCAB_SIZE] = get("embeddings.word_embeddings.weight")
    ours["embedding.word_embeddings.weight"] = embeddings
    for i in range(int(model["num_layers"])):
        attention = f"encoder.layer.{i}.attention.self."
        for kind, shape in (("weight", (n, d, h)), ("bias", (n, d))):
            q, k, v = (get(f"{attention}{part}.{kind}").reshape(shape) for part in ("query", "key", "value"))
            ours[f"decoder.layers.{i}.self_attention.linear_qkv.{kind}"] = torch.stack([q, k, v], dim=1).reshape(
                3 * h, *shape[2:]
            )
    for mine, theirs in _hf_pairs(int(model["num_layers"])):
        ours[mine] = get(theirs)
    bias = torch.zeros(padded_vocab_size)
    bias[:VOCAB_SIZE] = get("lm_head.bias")
    ours["output_layer.bias"] = bias
    ours = {name: value.contiguous() for name, value in ours.items()}

    notes: list[str] = []
    used = set(shapes)
    ignored: dict[str, list[str]] = {}
    unknown: list[str] = []
    for base, name in found.items():
        if base in used:
            continue
        kind = _ignored_kind(base)
        if kind is None:
            unknown.append(name)
        else:
            ignored.setdefault(kind, []).append(name)
    if ignored:
        parts = []
        for kind, names in ignored.items():
            parts.append(f"{kind}: {_listing(names, 2)}" if len(names) > 1 else f"{kind}: {names[0]}")
        notes.append("ignored Hugging Face tensors that are not model weights here; " + "; ".join(parts))
    decoder = found.get("lm_head.decoder.weight")
    if decoder is not None:
        value = hf_tensors[decoder]
        if tuple(value.shape) != (VOCAB_SIZE, h) or not torch.equal(
            value.to(torch.float32), ours["embedding.word_embeddings.weight"][:VOCAB_SIZE]
        ):
            notes.append(
                f"{decoder} differs from the word embeddings and was not used: the output layer is tied to the "
                "word embeddings, as in ESM-2 and EsmForMaskedLM"
            )
    if unknown:
        notes.append(f"ignored: {len(unknown)} tensor(s) not part of an ESM-2 EsmForMaskedLM: {_listing(unknown)}")
    return ours, notes


def bionemo_shapes(model: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every whole bionemo tensor of an ESM-2 with ``model`` settings (33 vocabulary rows)."""
    h = int(model["hidden_size"])
    shapes: dict[str, tuple[int, ...]] = {"embedding.word_embeddings.weight": (VOCAB_SIZE, h)}
    hf = _hf_shapes(model)
    for i in range(int(model["num_layers"])):
        shapes[f"decoder.layers.{i}.self_attention.linear_qkv.weight"] = (3 * h, h)
        shapes[f"decoder.layers.{i}.self_attention.linear_qkv.bias"] = (3 * h,)
    for mine, theirs in _hf_pairs(int(model["num_layers"])):
        shapes[mine] = hf[theirs]
    shapes["output_layer.bias"] = (VOCAB_SIZE,)
    return shapes


def check_bionemo_tensors(
    tensors: Mapping[str, torch.Tensor], model: Mapping[str, Any], *, padded_vocab: bool = True
) -> None:
    """Every bionemo tensor ``model`` needs is there, floating point, of the shape it implies, and finite.

    Args:
        tensors: Whole bionemo tensors.
        model: bionemo model settings.
        padded_vocab: Accept more than 33 vocabulary rows (megatron's padding), as a model's state holds them.

    Raises:
        CheckpointError: Missing tensors (named), a tensor whose shape disagrees with ``model``, or NaN/Inf.
    """
    shapes = bionemo_shapes(model)
    missing = [name for name in shapes if name not in tensors]
    if missing:
        raise CheckpointError(f"{len(missing)} bionemo tensor(s) are missing: {_listing(missing)}")
    for name, shape in shapes.items():
        value = tensors[name]
        found = tuple(value.shape)
        vocab_rows = padded_vocab and name in ("embedding.word_embeddings.weight", "output_layer.bias")
        if found != shape and not (vocab_rows and found[1:] == shape[1:] and found[0] >= VOCAB_SIZE):
            raise CheckpointError(f"tensor {name} has shape {found}, the config needs {shape} ({_config_text(model)})")
        if not value.is_floating_point():
            raise CheckpointError(f"tensor {name} has dtype {value.dtype}; model weights are floating point")
        _check_finite(name, value)


def _rotary_inv_freq(head_dim: int) -> torch.Tensor:
    """The ``inv_freq`` buffer of ``EsmForMaskedLM``'s rotary embeddings for heads of ``head_dim``."""
    return 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def bionemo_to_hf(tensors: Mapping[str, torch.Tensor], model: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Hugging Face ``EsmForMaskedLM`` tensors (``esm.``-prefixed, float32) from whole bionemo tensors.

    Vocabulary rows beyond the 33 tokens (megatron's padding) are cut. ``lm_head.decoder.weight`` is left out:
    ``EsmForMaskedLM`` ties it to the word embeddings when loading. The rotary ``inv_freq`` buffers are added so
    ``from_pretrained`` finds every buffer.

    Args:
        tensors: bionemo names (see the module docstring), vocabulary padded or not.
        model: bionemo model settings (``num_layers``, ``hidden_size``, ``num_attention_heads``,
            ``ffn_hidden_size``).

    Raises:
        CheckpointError: Missing tensors (named), a tensor whose shape disagrees with ``model``, or NaN/Inf.
    """
    check_bionemo_tensors(tensors, model)

    def get(name: str) -> torch.Tensor:
        return tensors[name].detach().to("cpu", torch.float32)

    h, n = int(model["hidden_size"]), int(model["num_attention_heads"])
    d = h // n
    hf: dict[str, torch.Tensor] = {
        "esm.embeddings.word_embeddings.weight": get("embedding.word_embeddings.weight")[:VOCAB_SIZE]
    }
    inv_freq = _rotary_inv_freq(d)
    for i in range(int(model["num_layers"])):
        attention = f"esm.encoder.layer.{i}.attention.self."
        for kind, shape in (("weight", (n, 3, d, h)), ("bias", (n, 3, d))):
            qkv = get(f"decoder.layers.{i}.self_attention.linear_qkv.{kind}").reshape(shape)
            for j, part in enumerate(("query", "key", "value")):
                hf[f"{attention}{part}.{kind}"] = qkv[:, j].reshape(h, *shape[3:])
        hf[f"{attention}rotary_embeddings.inv_freq"] = inv_freq
    for mine, theirs in _hf_pairs(int(model["num_layers"])):
        hf[theirs if theirs.startswith("lm_head.") else f"esm.{theirs}"] = get(mine)
    hf["lm_head.bias"] = get("output_layer.bias")[:VOCAB_SIZE]
    return {name: value.clone(memory_format=torch.contiguous_format) for name, value in hf.items()}


# --------------------------------------------------------------------------------------------------- folders


def _tokenizer_config() -> dict[str, Any]:
    added = {
        str(ESM_VOCAB.index(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in ("<cls>", "<pad>", "<eos>", "<unk>", "<mask>")
    }
    return {
        "added_tokens_decoder": added,
        "clean_up_tokenization_spaces": False,
        **_SPECIAL_TOKENS,
        "model_max_length": 1000000000000000019884624838656,
        "tokenizer_class": "EsmTokenizer",
    }


def write_hf_folder(
    folder: Path, tensors_hf: Mapping[str, torch.Tensor], model: Mapping[str, Any], force: bool = False
) -> Path:
    """Write an ``EsmForMaskedLM`` folder: weights, config and ``EsmTokenizer`` files.

    ``config.json``, ``model.safetensors`` (metadata ``{"format": "pt"}``), ``vocab.txt``,
    ``tokenizer_config.json`` and ``special_tokens_map.json`` are written into a temporary sibling folder that
    is renamed to ``folder`` at the end, so a failure leaves nothing behind.

    Args:
        folder: The folder to write; its parents are created.
        tensors_hf: Hugging Face tensors, as :func:`bionemo_to_hf` returns them.
        model: bionemo model settings (for ``config.json``).
        force: Replace the contents of an existing non-empty folder.

    Returns:
        ``folder``.

    Raises:
        CheckpointError: ``folder`` exists and is not a folder, or is not empty and ``force`` is false.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"{folder} exists and is not a folder; give a folder for the Hugging Face files")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise CheckpointError(f"{folder} is not empty; pass force (--force) to replace its contents")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        # the folder is renamed into place whole, so its files need no atomic writes of their own
        save_file(
            {name: value.detach().contiguous() for name, value in tensors_hf.items()},
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        (tmp / "config.json").write_text(json.dumps(hf_config(model), indent=2, sort_keys=True) + "\n")
        (tmp / "vocab.txt").write_text("\n".join(ESM_VOCAB) + "\n")
        (tmp / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(), indent=2) + "\n")
        (tmp / "special_tokens_map.json").write_text(json.dumps(_SPECIAL_TOKENS, indent=2) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        if folder.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".old", dir=folder.parent))
            moved = False
            try:
                os.replace(folder, old / folder.name)
                moved = True
                os.replace(tmp, folder)
            except BaseException:
                if moved:  # put the old contents back
                    os.replace(old / folder.name, folder)
                old.rmdir()  # only when empty: never removes the old contents
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def load_hf_checkpoint(
    folder: Path, padded_vocab_size: int
) -> tuple[dict[str, torch.Tensor], dict[str, Any], list[str]]:
    """Read a Hugging Face ESM-2 folder: bionemo tensors, bionemo model settings and notes.

    See :func:`read_hf_config`, :func:`read_hf_tensors` and :func:`hf_to_bionemo`.

    Raises:
        CheckpointError: Whatever those raise; tensor problems name the folder too.
        ValueError: ``padded_vocab_size`` below 33.
    """
    folder = Path(folder)
    model = read_hf_config(folder)
    hf_tensors = read_hf_tensors(folder)
    try:
        tensors, notes = hf_to_bionemo(hf_tensors, model, padded_vocab_size)
    except CheckpointError as error:
        raise CheckpointError(f"Hugging Face checkpoint {folder}: {error}") from None
    return tensors, model, notes
