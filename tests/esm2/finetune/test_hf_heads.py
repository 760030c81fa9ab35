"""Fine-tuned models read from their files: bionemo files with fine-tuning metadata, Hugging Face classifiers."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bionemo.esm2.checkpoints.header import read_checkpoint_header
from bionemo.esm2.checkpoints.load import load_checkpoint
from bionemo.esm2.checkpoints.weights import save_weights
from bionemo.esm2.finetune.head_config import HeadConfig, HeadKind
from bionemo.esm2.finetune.heads import build_head
from bionemo.esm2.finetune.layout import LORA_MODULES, head_shapes, lora_shapes
from bionemo.esm2.finetune.spec import FINETUNE_KEY, EncoderMode, FinetuneSpec, LoRASettings
from bionemo.esm2.finetune.tasks import LabelVocabulary, Task
from bionemo.esm2.hf.files import hf_to_bionemo, read_hf_tensors
from bionemo.esm2.hf.layout import CheckpointError
from support.hf_esm import mutate_config
from support.hf_finetuned import random_hf_classifier

MODEL = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "ffn_hidden_size": 48}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("base") / "hf"
    random_hf_classifier(folder)  # makes the EsmForMaskedLM base
    return folder


@pytest.mark.parametrize(
    "head",
    [
        HeadConfig(kind=HeadKind.HF_SEQUENCE),
        HeadConfig(kind=HeadKind.HF_TOKEN),
        HeadConfig(kind=HeadKind.MEAN_MLP, hidden_size=24),
        HeadConfig(kind=HeadKind.CONV_TOKEN, hidden_size=12, kernel_size=5),
    ],
    ids=lambda head: str(head.kind),
)
def test_head_shapes_are_those_of_the_built_heads(head):
    module = build_head(head, 32, 5)
    assert head_shapes(head, 32, 5) == {f"head.{k}": tuple(v.shape) for k, v in module.state_dict().items()}


def test_lora_modules_are_the_lora_targets():
    from bionemo.layers import LoRATarget

    assert {t.name.lower(): t.value for t in LoRATarget} == LORA_MODULES
    shapes = lora_shapes(LoRASettings(rank=4, targets=("qkv", "fc2")), MODEL)
    assert shapes == {
        **{f"decoder.layers.{i}.self_attention.linear_qkv.lora_A.weight": (4, 32) for i in range(2)},
        **{f"decoder.layers.{i}.self_attention.linear_qkv.lora_B.weight": (96, 4) for i in range(2)},
        **{f"decoder.layers.{i}.mlp.linear_fc2.lora_A.weight": (4, 48) for i in range(2)},
        **{f"decoder.layers.{i}.mlp.linear_fc2.lora_B.weight": (32, 4) for i in range(2)},
    }


# ------------------------------------------------------------------------------------- Hugging Face classifiers


@pytest.mark.parametrize(
    ("token", "config", "task", "columns", "classes"),
    [
        (False, {"id2label": {0: "a", 1: "c", 2: "b"}}, Task.CLASSIFICATION, ("label",), ("a", "c", "b")),
        (False, {"problem_type": "single_label_classification"}, Task.CLASSIFICATION, ("label",),
         ("LABEL_0", "LABEL_1", "LABEL_2")),
        (False, {"problem_type": "multi_label_classification", "id2label": {0: "x", 1: "y", 2: "z"}},
         Task.MULTILABEL, ("x", "y", "z"), ()),
        (False, {"problem_type": "regression", "id2label": {0: "tm", 1: "ph", 2: "kd"}}, Task.REGRESSION,
         ("tm", "ph", "kd"), ()),
        (True, {"id2label": {0: "H", 1: "E", 2: "C"}}, Task.TOKEN_CLASSIFICATION, ("label",), ("H", "E", "C")),
    ],
)  # fmt: skip
def test_a_classification_folder_reads_as_a_fine_tuned_model(tmp_path, base, token, config, task, columns, classes):
    folder = tmp_path / "cls"
    hf = random_hf_classifier(base, folder, token=token, **config)
    header = read_checkpoint_header(folder)
    spec = header.finetune
    assert spec is not None
    assert header.source == "huggingface"
    assert spec.task is task
    assert spec.head.kind is (HeadKind.HF_TOKEN if token else HeadKind.HF_SEQUENCE)
    assert spec.encoder is EncoderMode.FULL
    assert spec.lora is None
    assert spec.labels == LabelVocabulary(task=task, columns=columns, classes=classes)
    assert spec.head.dropout == 0.0  # random_hf_esm's hidden_dropout_prob
    loaded = load_checkpoint(folder)
    assert loaded.finetune == spec
    # the encoder as EsmForMaskedLM's converts (without its LM head), the head under our names
    encoder, _ = hf_to_bionemo(read_hf_tensors(base), loaded.model, 33)
    encoder = {k: v for k, v in encoder.items() if not k.startswith(("lm_head.", "output_layer."))}
    heads = {k: v for k, v in loaded.tensors.items() if k.startswith("head.")}
    assert loaded.tensors.keys() == encoder.keys() | heads.keys()
    for name, value in encoder.items():
        torch.testing.assert_close(loaded.tensors[name], value, rtol=0, atol=0, msg=name)
    if token:
        expected = {"head.classifier.weight": hf.classifier.weight, "head.classifier.bias": hf.classifier.bias}
    else:
        expected = {f"head.{k}": v for k, v in hf.classifier.state_dict().items()}
    assert heads.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(heads[name], value.detach(), rtol=0, atol=0, msg=name)


def test_classifier_dropout_is_the_heads_else_hidden_dropout(tmp_path, base):
    folder = tmp_path / "cls"
    random_hf_classifier(base, folder)
    mutate_config(folder, hidden_dropout_prob=0.2)
    assert read_checkpoint_header(folder).finetune.head.dropout == 0.2
    mutate_config(folder, classifier_dropout=0.35)
    assert read_checkpoint_header(folder).finetune.head.dropout == 0.35


def test_a_masked_lm_folder_is_no_fine_tuned_model(base):
    assert read_checkpoint_header(base).finetune is None
    loaded = load_checkpoint(base)
    assert loaded.finetune is None
    assert "output_layer.bias" in loaded.tensors


@pytest.mark.parametrize(
    ("token", "changes", "message"),
    [
        (False, {"problem_type": "ranking"}, "problem_type 'ranking'; valid for EsmForSequenceClassification: "
         "regression, single_label_classification, multi_label_classification"),
        (True, {"problem_type": "regression"}, "EsmForTokenClassification classifies each residue"),
        (False, {"id2label": {"0": "a", "2": "b", "3": "c"}}, "id2label has ids [0, 2, 3]; valid are 0..2"),
        (False, {"id2label": {"0": "a", "1": "a", "2": "b"}}, "id2label names ['a'] more than once"),
        (False, {"id2label": {"x": "a"}}, "id2label key 'x' is not an integer id"),
        (False, {"problem_type": "single_label_classification", "id2label": {"0": "only"}},
         "a classification vocabulary needs at least 2 classes"),
        (False, {"classifier_dropout": 1.5}, "dropout must lie in [0, 1), got 1.5"),
    ],
)  # fmt: skip
def test_bad_classification_configs_are_refused(tmp_path, base, token, changes, message):
    folder = tmp_path / "cls"
    random_hf_classifier(base, folder, token=token)
    mutate_config(folder, **changes)
    with pytest.raises(CheckpointError, match="config.json") as caught:
        read_checkpoint_header(folder)
    assert message in str(caught.value)


def _edit(folder: Path, edit) -> None:
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop("classifier.out_proj.bias"), "head's tensor(s) classifier.out_proj.bias are missing"),
        (lambda t: t.update({"classifier.out_proj.weight": torch.zeros(4, 32)}),
         "tensor classifier.out_proj.weight has shape (4, 32), the config needs (3, 32) (num_labels=3"),
        (lambda t: t.update({"classifier.extra.weight": torch.zeros(2)}), "classifier.extra.weight are not part"),
        (lambda t: t.pop("esm.encoder.layer.1.output.dense.weight"), "missing for an ESM-2 encoder"),
    ],
)  # fmt: skip
def test_bad_classification_tensors_are_refused(tmp_path, base, edit, message):
    folder = tmp_path / "cls"
    random_hf_classifier(base, folder)
    _edit(folder, edit)
    with pytest.raises(CheckpointError, match=f"Hugging Face checkpoint {folder}") as caught:
        read_checkpoint_header(folder)
    assert message in str(caught.value)


def test_nan_in_a_classification_head_is_found_when_loading(tmp_path, base):
    folder = tmp_path / "cls"
    random_hf_classifier(base, folder)
    _edit(folder, lambda t: t["classifier.dense.weight"].fill_(float("nan")))
    read_checkpoint_header(folder)  # the headers cannot tell
    with pytest.raises(CheckpointError, match="classifier.dense.weight holds NaN or Inf"):
        load_checkpoint(folder)


# ------------------------------------------------------------------------------------- bionemo fine-tuned files


def _spec(head: HeadKind = HeadKind.HF_SEQUENCE, lora: LoRASettings | None = None) -> FinetuneSpec:
    task = Task.TOKEN_CLASSIFICATION if head in (HeadKind.HF_TOKEN, HeadKind.CONV_TOKEN) else Task.CLASSIFICATION
    return FinetuneSpec(
        task=task,
        head=HeadConfig(kind=head),
        labels=LabelVocabulary(task=task, columns=("label",), classes=("a", "b", "c")),
        encoder=EncoderMode.LORA if lora else EncoderMode.FULL,
        lora=lora,
    )


def _finetuned_file(path: Path, base: Path, spec: FinetuneSpec, edit=None, metadata=None) -> Path:
    """A fine-tuned file on ``base``'s encoder with random LoRA factors and head (``edit``: change its tensors)."""
    loaded = load_checkpoint(base)
    generator = torch.Generator().manual_seed(3)
    tensors = {k: v for k, v in loaded.tensors.items() if not k.startswith(("lm_head.", "output_layer."))}
    shapes = {**head_shapes(spec.head, 32, spec.num_outputs)}
    if spec.lora is not None:
        shapes.update(lora_shapes(spec.lora, loaded.model))
    tensors.update({name: torch.randn(shape, generator=generator) for name, shape in shapes.items()})
    if edit is not None:
        edit(tensors)
    entries = {"model": loaded.model, "vocab_size": 33, FINETUNE_KEY: spec.to_json(), **(metadata or {})}
    save_weights(tensors, path, entries)
    return path


@pytest.mark.parametrize(
    "spec",
    [_spec(), _spec(HeadKind.CONV_TOKEN), _spec(HeadKind.HF_SEQUENCE, LoRASettings(rank=4, targets=("qkv", "fc1")))],
    ids=["full", "conv", "lora"],
)
def test_a_fine_tuned_file_reads_without_an_lm_head(tmp_path, base, spec):
    path = _finetuned_file(tmp_path / "model.safetensors", base, spec)
    header = read_checkpoint_header(path)
    assert header.finetune == spec
    assert header.contact_head  # the base's, kept
    loaded = load_checkpoint(path)
    assert loaded.finetune == spec
    stored = load_file(path)
    assert loaded.tensors.keys() == stored.keys()
    assert not any(name.startswith(("lm_head.", "output_layer.")) for name in stored)
    for name, value in stored.items():
        torch.testing.assert_close(loaded.tensors[name], value, rtol=0, atol=0, msg=name)


def test_pretrained_files_read_as_before(tmp_path, base):
    loaded = load_checkpoint(base)
    path = tmp_path / "pretrained.safetensors"
    save_weights(loaded.tensors, path, {"model": loaded.model, "vocab_size": 33})
    assert read_checkpoint_header(path).finetune is None
    assert load_checkpoint(path).finetune is None


LORA = LoRASettings(rank=4, targets=("qkv", "fc1"))


@pytest.mark.parametrize(
    ("spec", "edit", "message"),
    [
        (_spec(), lambda t: t.pop("head.out_proj.bias"), "tensor(s) of the hf-sequence head are missing: "
         "head.out_proj.bias"),
        (_spec(), lambda t: [t.pop(k) for k in list(t) if k.startswith("head.")],
         "the file holds no head.* tensor at all"),
        (_spec(), lambda t: t.update({"head.out_proj.weight": torch.zeros(2, 32)}),
         "tensor head.out_proj.weight has shape (2, 32), the config needs (3, 32) (a hf-sequence head with 3"),
        (_spec(), lambda t: t.update({"head.classifier.weight": torch.zeros(3, 32)}),
         "head.classifier.weight are not part of a hf-sequence head"),
        (_spec(lora=LORA), lambda t: t.pop("decoder.layers.1.mlp.linear_fc1.lora_B.weight"),
         "LoRA factor(s) are missing for --encoder lora with targets qkv, fc1: "
         "decoder.layers.1.mlp.linear_fc1.lora_B.weight"),
        (_spec(lora=LORA), lambda t: t.update({"decoder.layers.0.self_attention.linear_qkv.lora_A.weight":
                                               torch.zeros(8, 32)}),
         "tensor decoder.layers.0.self_attention.linear_qkv.lora_A.weight has shape (8, 32), the config needs "
         "(4, 32) (LoRA rank 4)"),
        (_spec(lora=LORA), lambda t: t.update({"decoder.layers.0.mlp.linear_fc2.lora_A.weight": torch.zeros(4, 48)}),
         "have no adapter in the fine-tuning metadata (targets qkv, fc1)"),
        (_spec(), lambda t: t.update({"decoder.layers.0.mlp.linear_fc2.lora_A.weight": torch.zeros(4, 48)}),
         "have no adapter in the fine-tuning metadata (--encoder full)"),
        (_spec(), lambda t: t.pop("decoder.layers.0.mlp.linear_fc1.bias"),
         "bionemo tensor(s) are missing: decoder.layers.0.mlp.linear_fc1.bias"),
        (_spec(), lambda t: t.update({"head.dense.weight": torch.zeros(32, 32, dtype=torch.int32)}),
         "tensor head.dense.weight has dtype torch.int32; model weights are floating point"),
    ],
)  # fmt: skip
def test_bad_fine_tuned_files_are_refused_naming_the_file(tmp_path, base, spec, edit, message):
    path = _finetuned_file(tmp_path / "model.safetensors", base, spec, edit)
    with pytest.raises(CheckpointError, match=f"checkpoint {path}") as caught:
        read_checkpoint_header(path)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("classification", "is a JSON str, not an object"),
        (
            {"task": "classification"},
            "cannot be read: fine-tuning metadata is incomplete or malformed: KeyError('head')",
        ),
        ({**_spec().to_json(), "task": "ranking"}, "cannot be read: 'ranking' is not a valid Task"),
        ({**_spec().to_json(), "encoder": "lora"}, "lora settings are given exactly when encoder is lora"),
        ({**_spec().to_json(), "head": {"kind": "hf-sequence", "width": 3}}, "head config has unknown keys"),
    ],
)
def test_malformed_fine_tuning_metadata_is_refused_naming_the_file(tmp_path, base, entry, message):
    path = _finetuned_file(tmp_path / "model.safetensors", base, _spec(), metadata={FINETUNE_KEY: entry})
    with pytest.raises(CheckpointError, match=f"checkpoint {path}: its fine-tuning metadata") as caught:
        read_checkpoint_header(path)
    assert message in str(caught.value)


def test_nan_in_lora_factors_is_found_when_loading(tmp_path, base):
    def nan(tensors):
        tensors["decoder.layers.0.self_attention.linear_qkv.lora_B.weight"][0, 0] = float("nan")

    path = _finetuned_file(tmp_path / "model.safetensors", base, _spec(lora=LORA), nan)
    read_checkpoint_header(path)
    with pytest.raises(CheckpointError, match="linear_qkv.lora_B.weight holds NaN or Inf"):
        load_checkpoint(path)


def test_the_header_module_stays_torch_free():
    import subprocess
    import sys

    code = "import sys, bionemo.esm2.checkpoints.header, bionemo.esm2.finetune.hf_heads; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "False"
