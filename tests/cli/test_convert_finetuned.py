"""``bionemo convert`` of fine-tuned models: classification folders in and out, LoRA merged or as a PEFT adapter."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.esm2.checkpoints.header import read_checkpoint_header
from bionemo.esm2.checkpoints.weights import read_metadata, save_weights
from bionemo.esm2.finetune.head_config import HeadConfig, HeadKind
from bionemo.esm2.finetune.layout import head_shapes
from bionemo.esm2.finetune.spec import FINETUNE_KEY, EncoderMode, FinetuneSpec, LoRASettings
from support.hf_esm import random_sequences
from support.hf_finetuned import hf_logits, interleaved_qkv, random_hf_classifier

runner = CliRunner()
RANK, ALPHA = 4, 8.0
SEQUENCES = random_sequences(5, seed=7, low=4, high=20)

CASES = {
    "classification": (False, {"id2label": {0: "low", 1: "mid", 2: "high"}}),
    "multilabel": (False, {"problem_type": "multi_label_classification", "id2label": {0: "x", 1: "y", 2: "z"}}),
    "regression": (False, {"problem_type": "regression", "id2label": {0: "tm", 1: "ph", 2: "kd"}}),
    "token": (True, {"id2label": {0: "H", 1: "E", 2: "C"}}),
}


def invoke(*args: str, code: int = 0):
    result = runner.invoke(app, ["convert", *args], env={"COLUMNS": "2000"})
    assert result.exit_code == code, result.output + repr(result.exception)
    return result


def flat(output: str) -> str:
    for border in "│╭╮╰╯─":
        output = output.replace(border, " ")
    return " ".join(output.split())


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("base") / "hf"
    random_hf_classifier(folder)  # makes the EsmForMaskedLM base
    return folder


def _hf_class(token: bool):
    from transformers import EsmForSequenceClassification, EsmForTokenClassification

    return EsmForTokenClassification if token else EsmForSequenceClassification


def _probabilities(logits: torch.Tensor, case: str) -> torch.Tensor:
    if case == "multilabel":
        return logits.sigmoid()
    return logits if case == "regression" else logits.softmax(-1)


def _close(mine, theirs, mask, token: bool) -> None:
    if token:  # the positions of real tokens (padding's rows differ by nothing that is read)
        mine, theirs = mine[mask], theirs[mask]
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-4)


@pytest.mark.parametrize("case", list(CASES))
def test_a_classification_folder_converts_both_ways_with_the_same_logits(tmp_path, base, case):
    token, config = CASES[case]
    hf = random_hf_classifier(base, tmp_path / "hf", token=token, **config)
    converted = tmp_path / "model.safetensors"
    invoke("from-hf", str(tmp_path / "hf"), str(converted))
    assert read_metadata(converted)[FINETUNE_KEY]["task"] == {"token": "token-classification"}.get(case, case)
    result = invoke("to-hf", str(converted), str(tmp_path / "back"))
    architecture = "EsmForTokenClassification" if token else "EsmForSequenceClassification"
    assert f"load it with transformers.{architecture}.from_pretrained" in flat(result.output)
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["architectures"] == [architecture]
    names = list(config["id2label"].values())
    assert written["id2label"] == {str(i): name for i, name in enumerate(names)}
    assert written["label2id"] == {name: i for i, name in enumerate(names)}
    assert written["num_labels"] == 3
    assert written["problem_type"] == config.get("problem_type", None if token else "single_label_classification")
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == [
        "config.json", "model.safetensors", "special_tokens_map.json", "tokenizer_config.json", "vocab.txt",
    ]  # fmt: skip
    again = _hf_class(token).from_pretrained(tmp_path / "back").eval()
    assert again.config.id2label == hf.config.id2label
    mine, mask = hf_logits(again, SEQUENCES)
    theirs, _ = hf_logits(hf, SEQUENCES)
    _close(mine, theirs, mask, token)


def _with_lora(path: Path, out: Path, targets: tuple[str, ...], seed: int = 5) -> dict[str, torch.Tensor]:
    """Rewrite the fine-tuned file ``path`` as one fine-tuned with LoRA (random factors) into ``out``.

    Returns the factors in Hugging Face's layout: ``<hf module>.A`` / ``<hf module>.B`` per adapted module
    (q, k and v share one ``A``), from which the fused megatron factors were built.
    """
    header = read_checkpoint_header(path)
    tensors = load_file(path)
    metadata = read_metadata(path)
    model = header.model
    h, f, heads = model["hidden_size"], model["ffn_hidden_size"], model["num_attention_heads"]
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator) / shape[-1] ** 0.5

    hf: dict[str, torch.Tensor] = {}
    for i in range(model["num_layers"]):
        layer, theirs = f"decoder.layers.{i}.", f"esm.encoder.layer.{i}."
        if "qkv" in targets:
            a, (bq, bk, bv) = rand(RANK, h), (rand(h, RANK) for _ in range(3))
            for part, b in zip(("query", "key", "value"), (bq, bk, bv), strict=True):
                hf[f"{theirs}attention.self.{part}.A"], hf[f"{theirs}attention.self.{part}.B"] = a, b
            tensors[f"{layer}self_attention.linear_qkv.lora_A.weight"] = a
            tensors[f"{layer}self_attention.linear_qkv.lora_B.weight"] = interleaved_qkv(bq, bk, bv, heads)
        for target, ours, module, (out_size, in_size) in (
            ("proj", "self_attention.linear_proj", "attention.output.dense", (h, h)),
            ("fc1", "mlp.linear_fc1", "intermediate.dense", (f, h)),
            ("fc2", "mlp.linear_fc2", "output.dense", (h, f)),
        ):
            if target in targets:
                a, b = rand(RANK, in_size), rand(out_size, RANK)
                hf[f"{theirs}{module}.A"], hf[f"{theirs}{module}.B"] = a, b
                tensors[f"{layer}{ours}.lora_A.weight"], tensors[f"{layer}{ours}.lora_B.weight"] = a, b
    spec = FinetuneSpec.from_json(metadata[FINETUNE_KEY])
    lora = LoRASettings(rank=RANK, alpha=ALPHA, targets=targets)
    spec = FinetuneSpec(task=spec.task, head=spec.head, labels=spec.labels, encoder=EncoderMode.LORA, lora=lora)
    save_weights(tensors, out, {**metadata, FINETUNE_KEY: spec.to_json()})
    return hf


def _merged_reference(hf, factors: dict[str, torch.Tensor]):
    """``hf`` with ``W + alpha / rank * B @ A`` added to each adapted module's weight, in plain torch."""
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    for name in [k.removesuffix(".A") for k in factors if k.endswith(".A")]:
        state[f"{name}.weight"] += ALPHA / RANK * factors[f"{name}.B"] @ factors[f"{name}.A"]
    reference = type(hf)(hf.config).eval()
    reference.load_state_dict(state)
    return reference


@pytest.mark.parametrize(
    ("case", "targets"),
    [("classification", ("qkv", "proj", "fc1", "fc2")), ("token", ("qkv", "fc2")), ("multilabel", ("proj",))],
)
def test_lora_is_merged_into_the_exported_weights_and_the_peft_adapter_predicts_the_same(tmp_path, base, case, targets):
    from peft import PeftModel

    token, config = CASES[case]
    hf = random_hf_classifier(base, tmp_path / "hf", token=token, **config)
    invoke("from-hf", str(tmp_path / "hf"), str(tmp_path / "full.safetensors"))
    lora_file = tmp_path / "lora.safetensors"
    factors = _with_lora(tmp_path / "full.safetensors", lora_file, targets)
    result = invoke("to-hf", str(lora_file), str(tmp_path / "merged"))
    assert "(LoRA merged into the weights)" in flat(result.output)
    merged = _hf_class(token).from_pretrained(tmp_path / "merged").eval()
    reference = _merged_reference(hf, factors)
    mine, mask = hf_logits(merged, SEQUENCES)
    expected, _ = hf_logits(reference, SEQUENCES)
    _close(mine, expected, mask, token)
    assert (mine - hf_logits(hf, SEQUENCES)[0]).abs().max() > 1e-2  # the adapters change the model

    result = invoke("to-hf", str(lora_file), str(tmp_path / "adapter"), "--peft")
    assert "peft.PeftModel.from_pretrained(" in flat(result.output)
    assert "num_labels=3" in flat(result.output)
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    # the pretrained base (EsmForMaskedLM) with a random classifier, which modules_to_save replaces
    start = _hf_class(token).from_pretrained(base, num_labels=3)
    adapted = PeftModel.from_pretrained(start, tmp_path / "adapter").eval()
    modules = {
        "qkv": ("attention.self.query", "attention.self.key", "attention.self.value"),
        "proj": ("attention.output.dense",),
        "fc1": ("intermediate.dense",),
        "fc2": ("output.dense",),
    }
    wanted = {f"esm.encoder.layer.{i}.{m}" for i in range(2) for t in targets for m in modules[t]}
    found = {n.removeprefix("base_model.model.") for n, m in adapted.named_modules() if hasattr(m, "lora_A")}
    assert found == wanted
    theirs, _ = hf_logits(adapted, SEQUENCES)
    _close(_probabilities(theirs, case), _probabilities(mine, case), mask, token)


def _finetuned_file(tmp_path: Path, base: Path, head: HeadKind, lora: bool) -> Path:
    """A fine-tuned file on ``base``'s encoder with a random ``head`` (and random LoRA factors)."""
    from bionemo.esm2.checkpoints.load import load_checkpoint
    from bionemo.esm2.finetune.layout import lora_shapes
    from bionemo.esm2.finetune.tasks import LabelVocabulary, Task

    loaded = load_checkpoint(base)
    task = Task.TOKEN_CLASSIFICATION if head.per_residue else Task.CLASSIFICATION
    settings = LoRASettings(rank=RANK) if lora else None
    spec = FinetuneSpec(
        task=task,
        head=HeadConfig(kind=head),
        labels=LabelVocabulary(task=task, columns=("label",), classes=("a", "b")),
        encoder=EncoderMode.LORA if lora else EncoderMode.FULL,
        lora=settings,
    )
    tensors = {k: v for k, v in loaded.tensors.items() if not k.startswith(("lm_head.", "output_layer."))}
    shapes = {**head_shapes(spec.head, 32, 2), **(lora_shapes(settings, loaded.model) if settings else {})}
    tensors.update({name: torch.randn(shape) for name, shape in shapes.items()})
    path = tmp_path / f"{head}-{lora}.safetensors"
    save_weights(tensors, path, {"model": loaded.model, "vocab_size": 33, FINETUNE_KEY: spec.to_json()})
    return path


@pytest.mark.parametrize(
    ("head", "lora", "peft", "message"),
    [
        (HeadKind.MEAN_MLP, False, False, "has a mean-mlp head, which transformers has no model for; heads that "
         "export to Hugging Face: hf-sequence (EsmForSequenceClassification), hf-token (EsmForTokenClassification)"),
        (HeadKind.CONV_TOKEN, True, True, "has a conv-token head, which transformers has no model for"),
        (HeadKind.HF_SEQUENCE, False, True, "was fine-tuned with --encoder full; --peft needs --encoder lora"),
        (HeadKind.HF_TOKEN, False, True, "was fine-tuned with --encoder full; --peft needs --encoder lora"),
        (None, False, True, "holds pretrained weights; --peft writes the LoRA adapter of a model fine-tuned with "
         "--encoder lora"),
    ],
)  # fmt: skip
def test_what_hugging_face_cannot_hold_is_refused_and_nothing_is_written(tmp_path, base, head, lora, peft, message):
    if head is None:
        checkpoint = tmp_path / "pretrained.safetensors"
        invoke("from-hf", str(base), str(checkpoint))
    else:
        checkpoint = _finetuned_file(tmp_path, base, head, lora)
    before = sorted(tmp_path.iterdir())
    result = invoke("to-hf", str(checkpoint), str(tmp_path / "out"), *(["--peft"] if peft else []), code=2)
    assert message in flat(result.output)
    assert sorted(tmp_path.iterdir()) == before


def test_an_exportable_fine_tuned_file_exports_while_a_bad_one_is_refused(tmp_path, base):
    # the same flags on an hf head with LoRA work (so the refusals above are of the head and the encoder mode)
    checkpoint = _finetuned_file(tmp_path, base, HeadKind.HF_TOKEN, lora=True)
    invoke("to-hf", str(checkpoint), str(tmp_path / "adapter"), "--peft")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["task_type"], config["r"], config["lora_alpha"]) == ("TOKEN_CLS", RANK, 16.0)
    assert config["modules_to_save"] == ["classifier"]
    # a damaged fine-tuned file: exit 2 naming it, nothing written
    tensors = load_file(checkpoint)
    del tensors["head.classifier.bias"]
    save_weights(tensors, checkpoint, read_metadata(checkpoint))
    result = invoke("to-hf", str(checkpoint), str(tmp_path / "merged"), code=2)
    assert f"checkpoint {checkpoint}" in flat(result.output)
    assert "head.classifier.bias" in flat(result.output)
    assert not (tmp_path / "merged").exists()
