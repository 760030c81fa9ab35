"""Hugging Face ESM-2 folders (``transformers.EsmForMaskedLM``) to and from bionemo's megatron-core tensors.

Reads and writes the files themselves (``config.json``, safetensors or ``pytorch_model.bin``, tokenizer files)
without importing ``transformers``; ``config.json`` and the tensor names and shapes (no torch) are in
:mod:`bionemo.esm2.hf.layout`. bionemo tensors are whole (unsharded) megatron-core names:

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
``contact_head.regression`` (optional)                  ``esm.contact_head.regression``
=====================================================  ================================================

megatron's fused ``linear_qkv`` holds, for each head ``j``, the ``d`` rows of ``q_j``, then of ``k_j``, then of
``v_j`` (``d = h / n``). The output projection is tied to the word embeddings on both sides, so Hugging Face's
``lm_head.decoder.weight`` is never read nor written. The contact head (``weight [1, layers * heads]``,
``bias [1]``) is copied both ways when the checkpoint has one; the megatron model does not hold it
(:mod:`bionemo.esm2.model.contacts` applies it to the attention maps).
"""

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from bionemo.core.atomic_files import give_default_permissions
from bionemo.esm2.hf.layout import (
    CONTACT_HEAD,
    ESM_VOCAB,
    HF_ROTARY_BASE,
    HF_WEIGHT_FILES,
    VOCAB_SIZE,
    CheckpointError,
    TensorInfo,
    bionemo_shapes,
    check_bionemo_layout,
    check_hf_layout,
    hf_config,
    hf_index_shards,
    hf_pairs,
    hf_rotary_base,
    hf_shapes,
    listing,
    read_hf_config,
)

__all__ = [
    "bionemo_to_hf",
    "check_bionemo_tensors",
    "check_finite",
    "hf_to_bionemo",
    "load_hf_checkpoint",
    "read_hf_tensors",
    "tensor_info",
    "write_folder",
    "write_hf_folder",
]

_SPECIAL_TOKENS = {
    "cls_token": "<cls>",
    "eos_token": "<eos>",
    "mask_token": "<mask>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
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
    tensors: dict[str, torch.Tensor] = {}
    for path in hf_index_shards(index):
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


def _ignored_kind(name: str) -> str | None:
    """Why a Hugging Face tensor (name without ``esm.``) is known and not needed, or None."""
    if name.endswith(".rotary_embeddings.inv_freq"):
        return "rotary inv_freq buffers (of base 10000, recomputed)"
    if name == "embeddings.position_ids":
        return "position_ids buffer"
    if name == "lm_head.decoder.weight":
        return "lm_head.decoder.weight (tied to the word embeddings)"
    return None


def tensor_info(value: torch.Tensor) -> TensorInfo:
    """What the layout checks of :mod:`bionemo.esm2.hf.layout` need of ``value``."""
    return TensorInfo(str(value.dtype), tuple(value.shape), value.is_floating_point())


def check_finite(name: str, value: torch.Tensor) -> None:
    """Refuse a tensor ``name`` holding NaN or Inf.

    One reduction over the tensor, no temporary of its size: ``torch.aminmax`` propagates NaN, and an Inf is the
    maximum or -Inf the minimum (9x faster than ``isfinite(value).all()`` on a 650M checkpoint on the CPU machine).

    Raises:
        CheckpointError: ``value`` has a NaN or Inf element.
    """
    if not value.is_floating_point() or value.numel() == 0:
        return
    low, high = torch.aminmax(value)
    if not bool(torch.isfinite(low) & torch.isfinite(high)):
        raise CheckpointError(f"tensor {name} holds NaN or Inf values; the checkpoint is damaged")


def hf_to_bionemo(
    hf_tensors: Mapping[str, torch.Tensor], model: Mapping[str, Any], padded_vocab_size: int, *, lm_head: bool = True
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Whole bionemo tensors (float32, contiguous, vocabulary padded with zeros) from Hugging Face ESM-2 tensors.

    Args:
        hf_tensors: Hugging Face names, with or without the ``esm.`` prefix of ``EsmForMaskedLM``.
        model: bionemo model settings, as :func:`read_hf_config` returns them.
        padded_vocab_size: Rows of the word embeddings and entries of the output bias (at least 33; see
            :func:`padded_vocab_size`).
        lm_head: Whether to read and return the language-model head; without it, the encoder's tensors only
            (``EsmFor{Sequence,Token}Classification``'s encoder; their head is not read here).

    Returns:
        The tensors (the contact head's too, where the folder has one: :data:`CONTACT_HEAD`) and one-line notes
        on tensors left out (rotary buffers, an untied decoder, unknown names).

    Raises:
        CheckpointError: Missing tensors (named), a tensor whose shape disagrees with the config, a tensor
            that is not floating point, NaN/Inf values, or rotary ``inv_freq`` buffers of another base than
            ``model["rotary_base"]`` (:data:`HF_ROTARY_BASE` in a Hugging Face config).
        ValueError: ``padded_vocab_size`` below 33.
    """
    if padded_vocab_size < VOCAB_SIZE:
        raise ValueError(f"padded_vocab_size {padded_vocab_size} is below ESM-2's {VOCAB_SIZE} tokens")
    # name without "esm." -> name in the file
    layout = {name: tensor_info(value) for name, value in hf_tensors.items()}
    found = check_hf_layout(layout, model, lm_head=lm_head)
    for name in [*hf_shapes(model, lm_head), *(name for name in CONTACT_HEAD if name in found)]:
        check_finite(found[name], hf_tensors[found[name]])
    _check_rotary_buffers(found, hf_tensors, model)

    def get(base: str) -> torch.Tensor:
        return hf_tensors[found[base]].detach().to("cpu", torch.float32)

    ours = _converted(get, model, padded_vocab_size, lm_head)
    if all(name in found for name in CONTACT_HEAD):  # check_hf_layout: both tensors or neither
        ours.update({name: get(name).contiguous() for name in CONTACT_HEAD})
    return ours, _conversion_notes(found, hf_tensors, ours, model, lm_head)


def _check_rotary_buffers(
    found: Mapping[str, str], hf_tensors: Mapping[str, torch.Tensor], model: Mapping[str, Any]
) -> None:
    """Refuse stored rotary ``inv_freq`` buffers of another base than ``model``'s (they are recomputed, not read).

    ``EsmForMaskedLM.from_pretrained`` loads these buffers from the file, so a folder may carry another base in
    them than its config can say; compared with a tolerance that a half-precision copy of base 10000 meets.
    """
    base = float(model.get("rotary_base", HF_ROTARY_BASE))
    expected = _rotary_inv_freq(int(model["hidden_size"]) // int(model["num_attention_heads"]), base)
    for short, name in found.items():
        if not short.endswith(".rotary_embeddings.inv_freq"):
            continue
        stored = hf_tensors[name].detach().to("cpu", torch.float32)
        if stored.shape != expected.shape or not torch.allclose(stored, expected, rtol=1e-2, atol=0.0):
            raise CheckpointError(
                f"{name} is not the rotary inv_freq of base {base:g} (the base of Hugging Face's ESM-2 config); "
                "a model with other rotary frequencies cannot be converted"
            )


def _converted(
    get: Callable[[str], torch.Tensor], model: Mapping[str, Any], padded_vocab_size: int, lm_head: bool = True
) -> dict[str, torch.Tensor]:
    """The bionemo tensors from ``get(hf_name_without_esm_prefix)``: q, k, v interleaved per head, vocabulary padded."""
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
    for mine, theirs in hf_pairs(int(model["num_layers"]), lm_head):
        ours[mine] = get(theirs)
    if lm_head:
        bias = torch.zeros(padded_vocab_size)
        bias[:VOCAB_SIZE] = get("lm_head.bias")
        ours["output_layer.bias"] = bias
    return {name: value.contiguous() for name, value in ours.items()}


def _conversion_notes(
    found: Mapping[str, str],
    hf_tensors: Mapping[str, torch.Tensor],
    ours: Mapping[str, torch.Tensor],
    model: Mapping[str, Any],
    lm_head: bool = True,
) -> list[str]:
    """One-line notes on the Hugging Face tensors left out: known non-weights, an untied decoder, unknown names."""
    notes: list[str] = []
    used = {*hf_shapes(model, lm_head), *CONTACT_HEAD}
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
            parts.append(f"{kind}: {listing(names, 2)}" if len(names) > 1 else f"{kind}: {names[0]}")
        notes.append("ignored Hugging Face tensors that are not model weights here; " + "; ".join(parts))
    decoder = found.get("lm_head.decoder.weight")
    if decoder is not None and lm_head:
        value = hf_tensors[decoder]
        if tuple(value.shape) != (VOCAB_SIZE, int(model["hidden_size"])) or not torch.equal(
            value.to(torch.float32), ours["embedding.word_embeddings.weight"][:VOCAB_SIZE]
        ):
            notes.append(
                f"{decoder} differs from the word embeddings and was not used: the output layer is tied to the "
                "word embeddings, as in ESM-2 and EsmForMaskedLM"
            )
    if unknown:
        kind = "an ESM-2 EsmForMaskedLM" if lm_head else "an ESM-2 encoder"
        notes.append(f"ignored: {len(unknown)} tensor(s) not part of {kind}: {listing(unknown)}")
    return notes


def check_bionemo_tensors(
    tensors: Mapping[str, torch.Tensor], model: Mapping[str, Any], *, padded_vocab: bool = True, lm_head: bool = True
) -> None:
    """Every bionemo tensor ``model`` needs is there, floating point, of the shape it implies, and finite.

    Args:
        tensors: Whole bionemo tensors.
        model: bionemo model settings.
        padded_vocab: Accept more than 33 vocabulary rows (megatron's padding), as a model's state holds them.
        lm_head: Whether the language-model head is needed (a fine-tuned model's encoder has none).

    Raises:
        CheckpointError: Missing tensors (named), a tensor whose shape disagrees with ``model``, or NaN/Inf; the
            same for the optional contact head (:data:`CONTACT_HEAD`: both tensors or neither).
    """
    layout = {name: tensor_info(value) for name, value in tensors.items()}
    contact_head = check_bionemo_layout(layout, model, padded_vocab=padded_vocab, lm_head=lm_head)
    for name in [*bionemo_shapes(model, lm_head=lm_head), *(CONTACT_HEAD if contact_head else ())]:
        check_finite(name, tensors[name])


def _rotary_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """The ``inv_freq`` buffer of rotary embeddings of ``base`` for heads of ``head_dim`` (``EsmForMaskedLM``'s)."""
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def bionemo_to_hf(
    tensors: Mapping[str, torch.Tensor], model: Mapping[str, Any], *, lm_head: bool = True
) -> dict[str, torch.Tensor]:
    """Hugging Face ``EsmForMaskedLM`` tensors (``esm.``-prefixed, float32) from whole bionemo tensors.

    Vocabulary rows beyond the 33 tokens (megatron's padding) are cut. ``lm_head.decoder.weight`` is left out:
    ``EsmForMaskedLM`` ties it to the word embeddings when loading. The rotary ``inv_freq`` buffers (of the
    model's ``rotary_base``) are added so ``from_pretrained`` finds every buffer. The contact head is written
    when ``tensors`` hold it (:data:`CONTACT_HEAD`); without it ``from_pretrained`` initializes one at random
    (and says so), as for any ``EsmForMaskedLM`` trained without one.

    Args:
        tensors: bionemo names (see the module docstring), vocabulary padded or not.
        model: bionemo model settings (``num_layers``, ``hidden_size``, ``num_attention_heads``,
            ``ffn_hidden_size``; ``rotary_base``, default 10000).
        lm_head: Whether to convert the language-model head; without it, the encoder's ``esm.*`` tensors only
            (for ``EsmFor{Sequence,Token}Classification``, whose head the caller adds).

    Raises:
        CheckpointError: A ``rotary_base`` Hugging Face cannot hold (:func:`hf_rotary_base`), missing tensors
            (named), a tensor whose shape disagrees with ``model``, or NaN/Inf.
    """
    base = hf_rotary_base(model)
    check_bionemo_tensors(tensors, model, lm_head=lm_head)

    def get(name: str) -> torch.Tensor:
        return tensors[name].detach().to("cpu", torch.float32)

    h, n = int(model["hidden_size"]), int(model["num_attention_heads"])
    d = h // n
    hf: dict[str, torch.Tensor] = {
        "esm.embeddings.word_embeddings.weight": get("embedding.word_embeddings.weight")[:VOCAB_SIZE]
    }
    inv_freq = _rotary_inv_freq(d, base)
    for i in range(int(model["num_layers"])):
        attention = f"esm.encoder.layer.{i}.attention.self."
        for kind, shape in (("weight", (n, 3, d, h)), ("bias", (n, 3, d))):
            qkv = get(f"decoder.layers.{i}.self_attention.linear_qkv.{kind}").reshape(shape)
            for j, part in enumerate(("query", "key", "value")):
                hf[f"{attention}{part}.{kind}"] = qkv[:, j].reshape(h, *shape[3:])
        hf[f"{attention}rotary_embeddings.inv_freq"] = inv_freq
    for mine, theirs in hf_pairs(int(model["num_layers"]), lm_head):
        hf[theirs if theirs.startswith("lm_head.") else f"esm.{theirs}"] = get(mine)
    if lm_head:
        hf["lm_head.bias"] = get("output_layer.bias")[:VOCAB_SIZE]
    for name in CONTACT_HEAD:
        if name in tensors:
            hf[f"esm.{name}"] = get(name)
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
    folder: Path,
    tensors_hf: Mapping[str, torch.Tensor],
    model: Mapping[str, Any],
    force: bool = False,
    *,
    config: Mapping[str, Any] | None = None,
) -> Path:
    """Write an ``EsmForMaskedLM`` folder (or another ESM model's): weights, config and ``EsmTokenizer`` files.

    ``config.json``, ``model.safetensors`` (metadata ``{"format": "pt"}``), ``vocab.txt``,
    ``tokenizer_config.json`` and ``special_tokens_map.json`` are written as :func:`write_folder` writes files,
    so a failure leaves nothing behind.

    Args:
        folder: The folder to write; its parents are created.
        tensors_hf: Hugging Face tensors, as :func:`bionemo_to_hf` returns them.
        model: bionemo model settings (for ``config.json``).
        force: Replace the contents of an existing non-empty folder.
        config: ``config.json``'s settings; default :func:`hf_config` of ``model`` (an ``EsmForMaskedLM``).

    Returns:
        ``folder``.

    Raises:
        CheckpointError: ``folder`` exists and is not a folder, or is not empty and ``force`` is false.
    """
    settings = dict(hf_config(model) if config is None else config)

    def write(tmp: Path) -> None:
        save_file(
            {name: value.detach().contiguous() for name, value in tensors_hf.items()},
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        (tmp / "config.json").write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
        (tmp / "vocab.txt").write_text("\n".join(ESM_VOCAB) + "\n")
        (tmp / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(), indent=2) + "\n")
        (tmp / "special_tokens_map.json").write_text(json.dumps(_SPECIAL_TOKENS, indent=2) + "\n")

    return write_folder(folder, write, force=force)


def write_folder(folder: Path, write: Callable[[Path], None], *, force: bool = False) -> Path:
    """Create ``folder`` whole: ``write(tmp)`` fills a temporary sibling folder that is then renamed to ``folder``.

    A failure (of ``write`` too) leaves nothing behind; with ``force`` an existing folder is replaced only once
    the new one is complete, and put back if the rename fails.

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
        write(tmp)  # the folder is renamed into place whole, so its files need no atomic writes of their own
        give_default_permissions(tmp)
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
