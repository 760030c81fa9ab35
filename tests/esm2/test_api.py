"""``bionemo.esm2.api.predict``: sequences in, tensors out, against transformers' hidden states and the CLI's file.

The model is a tiny random Hugging Face ESM-2 built here (fp32 on the CPU).
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bionemo.esm2.api import predict
from bionemo.esm2.tokenizer import ProteinTokenizer
from bionemo.recipes.outputs import read_predictions
from bionemo.recipes.settings import SettingsError
from support.cli_runs import bionemo
from support.hf_esm import random_hf_esm, random_sequences


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("api") / "hf"
    return path, random_hf_esm(path, hidden=32, heads=2, layers=2)


def test_outputs_are_transformers_hidden_states_in_input_order(hf):
    path, model = hf
    sequences = random_sequences(5, seed=3)
    out = predict(path, [("first", sequences[0]), *sequences[1:]], include=["embeddings", "residue-embeddings", "cls"],
                  layer=[1], accelerator="cpu")  # fmt: skip
    assert out.ids == ["first", "row2", "row3", "row4", "row5"]  # given ids, else the CLI's row numbers
    tokenizer = ProteinTokenizer()
    residues, layer1 = out.residues(), out.residues("residue_embeddings.layer1")
    for i, sequence in enumerate(sequences):
        with torch.no_grad():
            states = model(input_ids=tokenizer.encode(sequence)[None], output_hidden_states=True).hidden_states
        torch.testing.assert_close(out.embeddings[i], states[-1][0, 1:-1].mean(0), rtol=0, atol=1e-4)
        torch.testing.assert_close(residues[i], states[-1][0, 1:-1], rtol=0, atol=1e-4)
        torch.testing.assert_close(layer1[i], states[1][0, 1:-1], rtol=0, atol=1e-4)
        torch.testing.assert_close(out["cls"][i], states[-1][0, 0], rtol=0, atol=1e-4)
    with pytest.raises(KeyError, match="'perplexity' was not predicted; these were: cls, embeddings"):
        out["perplexity"]


def test_the_same_tensors_as_bionemo_run_predict_writes(hf, tmp_path):
    path, _ = hf
    sequences = random_sequences(4, seed=4)
    fasta = tmp_path / "s.fasta"
    fasta.write_text("".join(f">row{i + 1}\n{s}\n" for i, s in enumerate(sequences)))
    bionemo("run", "predict", "--checkpoint", str(path), "--data", str(fasta), "--output-dir", str(tmp_path / "cli"),
            "--include", "embeddings", "--include", "perplexity", "--accelerator", "cpu", cwd=tmp_path)  # fmt: skip
    ids, written = read_predictions(tmp_path / "cli" / "predictions.safetensors")
    out = predict(path, sequences, include=["embeddings", "perplexity"], accelerator="cpu")
    assert out.ids == ids
    assert out.tensors.keys() == written.keys()
    for key, value in written.items():
        torch.testing.assert_close(out[key], value, rtol=0, atol=0)


def test_errors_name_the_item_and_leave_nothing_behind(hf, tmp_path, monkeypatch):
    path, _ = hf
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingsError, match=r"sequences.*'row2'.*\['1'\]"):
        predict(path, ["MKV", "MK1V"], accelerator="cpu")
    with pytest.raises(SettingsError, match=r"include.*'embeddings'.*\(got 'everything'\)"):
        predict(path, ["MKV"], include=["everything"], accelerator="cpu")
    with pytest.raises(TypeError, match="not one str"):
        predict(path, "MKV", accelerator="cpu")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_importing_the_python_apis_imports_no_torch():
    probe = (
        "import sys; import bionemo.esm2.api, bionemo.esm2.finetune.api; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning', 'megatron', 'nemo')))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"  # torch comes with the first call (a notebook imports in a blink)
