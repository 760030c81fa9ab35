"""Hugging Face's classification models as fine-tuned models: ``config.json`` <-> :class:`FinetuneSpec`, head names.

``EsmForSequenceClassification`` holds the encoder (``esm.*``) and ``classifier.dense`` / ``classifier.out_proj``
(:class:`~bionemo.esm2.finetune.heads.HFSequenceHead`'s ``head.dense`` / ``head.out_proj``);
``EsmForTokenClassification`` the encoder and ``classifier`` (:class:`~bionemo.esm2.finetune.heads.HFTokenHead`'s
``head.classifier``). What the outputs mean is in ``config.json``:

===============================  =======================================  ================================
``config.json``                  :class:`FinetuneSpec`                    note
===============================  =======================================  ================================
``architectures``                ``head.kind`` (hf-sequence, hf-token)    token: ``token-classification``
``problem_type``                 ``task``                                 see :data:`PROBLEM_TYPES`
``id2label`` (id order)          ``labels.classes`` / ``labels.columns``  classes for the categorical tasks
``classifier_dropout``           ``head.dropout``                         else ``hidden_dropout_prob``
===============================  =======================================  ================================

Only the standard library is used (``bionemo.esm2.checkpoints.header`` reads these folders before torch).
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bionemo.esm2.finetune.head_config import HeadConfig, HeadKind
from bionemo.esm2.finetune.layout import head_shapes
from bionemo.esm2.finetune.spec import HEAD_PREFIX, FinetuneSpec
from bionemo.esm2.finetune.tasks import LabelVocabulary, Task
from bionemo.esm2.hf.layout import CheckpointError, TensorInfo, check_tensor, hf_config, listing, read_config_json

__all__ = [
    "HF_ARCHITECTURES",
    "HF_HEAD_PREFIX",
    "PROBLEM_TYPES",
    "bionemo_head_name",
    "check_hf_head_layout",
    "hf_finetuned_config",
    "hf_head_name",
    "hf_head_shapes",
    "read_hf_finetune_spec",
]

HF_ARCHITECTURES = {
    HeadKind.HF_SEQUENCE: "EsmForSequenceClassification",
    HeadKind.HF_TOKEN: "EsmForTokenClassification",
}
"""The transformers class of each head that exports (``config.json``'s ``architectures``)."""

HF_HEAD_PREFIX = "classifier."
"""Names of the head's tensors in a Hugging Face classification folder start with this (no ``esm.``)."""

PROBLEM_TYPES = {
    "regression": Task.REGRESSION,
    "single_label_classification": Task.CLASSIFICATION,
    "multi_label_classification": Task.MULTILABEL,
}
"""``EsmForSequenceClassification``'s ``problem_type`` -> task. Without one, transformers decides by the labels;
here ``num_labels == 1`` is regression and more are classification (its choice for integer labels)."""

_DEFAULT_LABELS = 2  # PretrainedConfig's num_labels


def hf_head_name(kind: HeadKind, name: str) -> str:
    """The Hugging Face name of our head tensor ``name`` (``head.dense.weight`` -> ``classifier.dense.weight``)."""
    inner = name.removeprefix(HEAD_PREFIX)
    return inner if kind is HeadKind.HF_TOKEN else HF_HEAD_PREFIX + inner


def bionemo_head_name(kind: HeadKind, name: str) -> str:
    """Our name of the Hugging Face head tensor ``name``: the inverse of :func:`hf_head_name`."""
    return HEAD_PREFIX + (name if kind is HeadKind.HF_TOKEN else name.removeprefix(HF_HEAD_PREFIX))


def hf_head_shapes(spec: FinetuneSpec, hidden_size: int) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> shape of each head tensor of ``spec``'s head (an ``hf`` head)."""
    shapes = head_shapes(spec.head, hidden_size, spec.num_outputs)
    return {hf_head_name(spec.head.kind, name): shape for name, shape in shapes.items()}


def check_hf_head_layout(tensors: Mapping[str, TensorInfo], spec: FinetuneSpec, hidden_size: int) -> None:
    """The Hugging Face head tensors (``classifier.*``) are those of ``spec``'s head, floating point.

    Raises:
        CheckpointError: A missing head tensor, one the head does not have, a shape that disagrees with
            ``num_labels`` and ``hidden_size``, or a tensor that is not floating point.
    """
    shapes = hf_head_shapes(spec, hidden_size)
    architecture = HF_ARCHITECTURES[spec.head.kind]
    missing = [name for name in shapes if name not in tensors]
    if missing:
        raise CheckpointError(f"the {architecture} head's tensor(s) {listing(missing)} are missing")
    unexpected = [name for name in tensors if name.startswith(HF_HEAD_PREFIX) and name not in shapes]
    if unexpected:
        raise CheckpointError(
            f"tensor(s) {listing(unexpected)} are not part of {architecture}'s head ({', '.join(shapes)})"
        )
    for name, shape in shapes.items():
        check_tensor(name, tensors[name], shape, f"num_labels={spec.num_outputs}, hidden_size={hidden_size}")


def read_hf_finetune_spec(folder: Path) -> FinetuneSpec | None:
    """The fine-tuned model a Hugging Face folder's ``config.json`` describes; None for other architectures.

    Raises:
        CheckpointError: An ``EsmFor{Sequence,Token}Classification`` config whose ``problem_type``, ``id2label``
            (ids 0..n-1, names unique), ``num_labels`` or dropout cannot be a fine-tuned model here; the message
            names ``config.json`` and lists what is valid.
    """
    path = Path(folder) / "config.json"
    config = read_config_json(path)
    architectures = config.get("architectures") or []
    kind = next((k for k, name in HF_ARCHITECTURES.items() if name in architectures), None)
    if kind is None:
        return None
    task = _task(path, config, kind)
    names = _label_names(path, config)
    try:
        if task.categorical:
            labels = LabelVocabulary(task=task, columns=("label",), classes=names)
        else:
            labels = LabelVocabulary(task=task, columns=names)
        dropout = config.get("classifier_dropout")
        head = HeadConfig(kind=kind, dropout=config.get("hidden_dropout_prob", 0.1) if dropout is None else dropout)
        return FinetuneSpec(task=task, head=head, labels=labels)
    except (ValueError, TypeError) as error:
        raise CheckpointError(f"{path} ({HF_ARCHITECTURES[kind]}): {error}") from None


def _task(path: Path, config: Mapping[str, Any], kind: HeadKind) -> Task:
    problem = config.get("problem_type")
    architecture = HF_ARCHITECTURES[kind]
    if kind is HeadKind.HF_TOKEN:
        if problem not in (None, "single_label_classification"):
            raise CheckpointError(
                f"{path} has problem_type {problem!r}; {architecture} classifies each residue (valid: "
                "single_label_classification or none)"
            )
        return Task.TOKEN_CLASSIFICATION
    if problem is None:
        return Task.REGRESSION if _num_labels(path, config) == 1 else Task.CLASSIFICATION
    if problem not in PROBLEM_TYPES:
        raise CheckpointError(
            f"{path} has problem_type {problem!r}; valid for {architecture}: {', '.join(PROBLEM_TYPES)} or none"
        )
    return PROBLEM_TYPES[problem]


def _num_labels(path: Path, config: Mapping[str, Any]) -> int:
    id2label = config.get("id2label")
    if isinstance(id2label, dict):
        return len(id2label)
    value = config.get("num_labels", _DEFAULT_LABELS)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{path} has num_labels {value!r}; it must be a positive integer")
    return value


def _label_names(path: Path, config: Mapping[str, Any]) -> tuple[str, ...]:
    """``id2label``'s names in id order (``LABEL_<i>`` as transformers names them where the config has none)."""
    id2label = config.get("id2label")
    if id2label is None:
        return tuple(f"LABEL_{i}" for i in range(_num_labels(path, config)))
    if not isinstance(id2label, dict) or not id2label:
        raise CheckpointError(f"{path} has id2label {id2label!r}; it must map the ids 0..n-1 to label names")
    by_id: dict[int, str] = {}
    for key, name in id2label.items():
        try:
            by_id[int(key)] = str(name)
        except ValueError:
            raise CheckpointError(f"{path}: id2label key {key!r} is not an integer id") from None
    if sorted(by_id) != list(range(len(by_id))):
        raise CheckpointError(f"{path}: id2label has ids {sorted(by_id)}; valid are 0..{len(by_id) - 1}, each once")
    names = tuple(by_id[i] for i in range(len(by_id)))
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise CheckpointError(f"{path}: id2label names {twice} more than once; each output needs its own name")
    num_labels = config.get("num_labels")
    if num_labels is not None and num_labels != len(names):
        raise CheckpointError(f"{path} has num_labels {num_labels!r} but id2label names {len(names)} labels")
    return names


def hf_finetuned_config(model: Mapping[str, Any], spec: FinetuneSpec) -> dict[str, Any]:
    """The ``config.json`` of the ``EsmFor{Sequence,Token}Classification`` of ``spec`` on an encoder ``model``.

    :func:`bionemo.esm2.hf.layout.hf_config`'s settings with ``architectures``, ``num_labels``, ``id2label`` /
    ``label2id`` (the outputs in order: classes, else label columns), ``problem_type`` (sequence tasks) and
    ``classifier_dropout`` (the head's; transformers' ESM heads use ``hidden_dropout_prob``, the encoder's).
    :func:`read_hf_finetune_spec` reads it back (the column name of a categorical task reads back as ``label``).

    Raises:
        ValueError: A head transformers has no model for (``spec.head.exportable_to_hf`` is False).
        CheckpointError: A ``rotary_base`` Hugging Face cannot hold.
    """
    if spec.head.kind not in HF_ARCHITECTURES:
        raise ValueError(
            f"a {spec.head.kind} head has no Hugging Face model; heads that export: "
            f"{', '.join(f'{k} ({name})' for k, name in HF_ARCHITECTURES.items())}"
        )
    outputs = spec.labels.outputs
    problem = {task: name for name, task in PROBLEM_TYPES.items()}.get(spec.task)
    return {
        **hf_config(model),
        "architectures": [HF_ARCHITECTURES[spec.head.kind]],
        "num_labels": len(outputs),
        "id2label": {str(i): name for i, name in enumerate(outputs)},
        "label2id": {name: i for i, name in enumerate(outputs)},
        "problem_type": problem if spec.head.kind is HeadKind.HF_SEQUENCE else None,
        "classifier_dropout": spec.head.dropout,
    }
