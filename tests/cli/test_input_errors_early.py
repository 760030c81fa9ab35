"""Bad input is refused before torch, Lightning, NeMo or megatron-core are imported.

Each case runs ``bionemo run ...`` in a fresh process through a wrapper that reports, at exit, which of those
libraries were imported: none may be, the exit code is 2 and the message names the problem. The speed itself
is measured by tools/bench_input_errors.py, not here. ``CUDA_VISIBLE_DEVICES=""`` makes every machine answer as
a GPU-less one does (a machine with GPUs asks torch how many it has, on purpose).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "lightning", "pytorch_lightning", "nemo", "megatron", "transformers")

WRAPPER = f"""
import atexit, json, runpy, sys
atexit.register(lambda: print("HEAVY=" + json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr))
sys.argv = ["bionemo", *sys.argv[1:]]
runpy.run_module("bionemo.cli", run_name="__main__")
"""


def bionemo(*args: str, cwd: Path) -> tuple[int, str, list[str]]:
    """Exit code, output with the box borders flattened, and the heavy libraries the process imported."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "COLUMNS": "400"}
    result = subprocess.run(
        [sys.executable, "-c", WRAPPER, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    heavy_lines = [line for line in result.stderr.splitlines() if line.startswith("HEAVY=")]
    assert heavy_lines, result.stderr[-3000:]
    text = result.stdout + result.stderr.replace(heavy_lines[-1], "")
    for border in "│╭╮╰╯─":
        text = text.replace(border, " ")
    return result.returncode, " ".join(text.split()), json.loads(heavy_lines[-1].removeprefix("HEAVY="))


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def truncated_bundled_checkpoint(tmp: Path) -> str:
    from bionemo.esm2.recipes import BUNDLED_CHECKPOINT

    data = BUNDLED_CHECKPOINT.read_bytes()
    (tmp / "half.safetensors").write_bytes(data[: len(data) // 2])
    return str(tmp / "half.safetensors")


def empty_dir(path: Path) -> str:
    path.mkdir()
    return str(path)


def prediction_folder(path: Path) -> str:
    """A folder as `run predict` leaves it: predictions.safetensors (any bytes: only its name is looked at)."""
    path.mkdir()
    write(path / "predictions.safetensors", "x")
    return str(path)


def training_run(path: Path) -> str:
    """A folder as `run train` leaves it once started: its settings.yaml (and later checkpoints, summary.json)."""
    path.mkdir()
    write(path / "settings.yaml", "recipe: esm2-demo\n")
    return str(path)


def run_folder(path: Path) -> str:
    """A run's output folder: the exported bionemo model.safetensors (the bundled one here), no config.json."""
    import shutil

    from bionemo.esm2.recipes import BUNDLED_CHECKPOINT

    path.mkdir()
    shutil.copy(BUNDLED_CHECKPOINT, path / "model.safetensors")
    return str(path)


def hf_folder(tmp: Path, name: str, **config) -> str:
    from support.hf_esm import mutate_config, random_hf_esm

    random_hf_esm(tmp / name)
    if config:
        mutate_config(tmp / name, **config)
    return str(tmp / name)


CASES = {
    "missing data": (lambda t: ["predict", "--data", str(t / "no.fasta")], "does not exist"),
    "empty FASTA": (lambda t: ["predict", "--data", write(t / "e.fasta", "")], "holds no sequences"),
    "no FASTA header": (lambda t: ["predict", "--data", write(t / "n.fasta", "MKV\n")], "before the first '>'"),
    "bad characters": (
        lambda t: ["predict", "--data", write(t / "b.fasta", ">a\nMKV1Z\n")],
        "characters ['1'] outside the amino-acid alphabet",
    ),
    "too long": (lambda t: ["predict", "--data", write(t / "l.fasta", f">x\n{'A' * 1100}\n")], "pass --truncate"),
    "CSV without sequence": (lambda t: ["predict", "--data", write(t / "c.csv", "id,seq\na,M\n")], "'sequence'"),
    "missing checkpoint": (lambda t: ["predict", "--checkpoint", str(t / "no.safetensors")], "does not exist"),
    "corrupt checkpoint": (
        lambda t: ["predict", "--checkpoint", write(t / "bad.safetensors", "not a safetensors file")],
        "not a readable safetensors file",
    ),
    "truncated checkpoint": (
        lambda t: ["predict", "--checkpoint", truncated_bundled_checkpoint(t)],
        "not a readable safetensors file",
    ),
    "training checkpoint": (lambda t: ["predict", "--checkpoint", write(t / "last.ckpt", "x")], "training"),
    "a run's folder": (
        lambda t: ["predict", "--checkpoint", run_folder(t / "run")],
        "is a bionemo run's folder, not a Hugging Face one (it has no config.json): --checkpoint takes the weights "
        "file the run exported",
    ),
    "HF folder without config": (
        lambda t: ["predict", "--checkpoint", empty_dir(t / "empty_hf")],
        "has no config.json",
    ),
    "HF shapes disagree": (
        lambda t: ["predict", "--checkpoint", hf_folder(t, "hf", intermediate_size=100)],
        "esm.encoder.layer.0.intermediate.dense.weight has shape (256, 64), the config needs (100, 64)",
    ),
    "unknown recipe": (lambda t: ["predict", "--recipe", "nope"], "unknown recipe 'nope'"),
    "recipe of another shape": (lambda t: ["predict", "--recipe", "esm2-gpu"], "recipe esm2-gpu has num_layers=12"),
    "output dir is a training run's": (
        lambda t: ["predict", "--output-dir", training_run(t / "run")],
        "is a training run's folder (its settings.yaml, checkpoints and summary.json)",
    ),
    "output dir is a file": (lambda t: ["predict", "--output-dir", write(t / "f", "x")], "is an existing file"),
    "output dir below a file": (
        lambda t: ["predict", "--output-dir", str(Path(write(t / "g", "x")) / "sub")],
        "cannot be created: Not a directory",
    ),
    "layer out of range": (lambda t: ["predict", "--layer", "9"], "--layer 9: this model has layers 0"),
    "tokens per batch too small": (
        lambda t: ["predict", "--tokens-per-batch", "3"],
        "--tokens-per-batch 3 is less than sequence",
    ),
    "unpadded on CPU": (lambda t: ["predict", "--unpadded"], "--unpadded needs CUDA GPUs"),
    "GPUs on a CPU machine": (lambda t: ["predict", "--accelerator", "gpu"], "no CUDA GPU"),
    "megatron on CPU": (lambda t: ["predict", "--strategy", "megatron", "--accelerator", "cpu"], "needs GPUs"),
    "devices % TP x PP x CP": (
        lambda t: ["train", "--devices", "3", "--tensor-parallel", "2"],
        "--devices x --num-nodes = 3 is not divisible",
    ),
    "train: output dir holds predictions": (
        lambda t: ["train", "--output-dir", prediction_folder(t / "predicted")],
        "holds `run predict`'s outputs (predictions.safetensors, summary.json)",
    ),
    "train: missing data": (lambda t: ["train", "--data", str(t / "no.fasta")], "does not exist"),
    "train: one sequence": (lambda t: ["train", "--data", write(t / "o.fasta", ">a\nMKV\n")], "at least 2"),
    "train: checkpoint of another shape": (
        lambda t: ["train", "--checkpoint", hf_folder(t, "hf2")],
        "recipe esm2-demo has num_layers=4",
    ),
    "train: global batch not a multiple of micro": (
        lambda t: ["train", "--micro-batch-size", "5", "--global-batch-size", "16"],
        "global batch size 16 is not a multiple of micro-batch size x data-parallel size = 5 x 1 = 5; "
        "valid global batch sizes: 5, 10, 15",
    ),
    "train: global batch below micro x DP": (
        lambda t: ["train", "--micro-batch-size", "16", "--global-batch-size", "8"],
        "valid global batch sizes: 16, 32, 48, ...; or a micro-batch size of 1, 2, 4, 8",
    ),
    "train: recipe's global batch on 3 ranks": (
        lambda t: ["train", "--devices", "3", "--accelerator", "cpu"],
        "recipe esm2-demo's batch sizes on 3 data-parallel rank(s)",
    ),
    "train: unknown config key": (lambda t: ["train", "--config", write(t / "c.yaml", "devicez: 2\n")], "devicez"),
    "train: bad config value": (lambda t: ["train", "--config", write(t / "d.json", '{"devices": 0}')], "devices"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_exits_2_before_any_heavy_import(tmp_path, case):
    make_args, message = CASES[case]
    out = tmp_path / "out"
    args = make_args(tmp_path)
    if "--output-dir" not in args:
        args = [*args, "--output-dir", str(out)]
    code, text, heavy = bionemo("run", *args, cwd=tmp_path)
    assert code == 2, text
    assert message in text, text
    assert heavy == [], f"{case}: imported {heavy} before refusing the input"
    assert not out.exists()  # nothing was created for a refused run


def test_a_nan_checkpoint_is_still_refused_once_its_tensors_are_read(tmp_path):
    """Values are checked after the header checks (they need torch): the refusal stays, no output is left."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from bionemo.esm2.recipes import BUNDLED_CHECKPOINT

    with safe_open(str(BUNDLED_CHECKPOINT), framework="pt") as f:
        metadata = f.metadata()
        tensors = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118
    tensors["lm_head.dense.weight"][0, 0] = float("nan")
    save_file(tensors, str(tmp_path / "nan.safetensors"), metadata=metadata)
    out = tmp_path / "out"
    code, text, _ = bionemo(
        "run", "predict", "--checkpoint", str(tmp_path / "nan.safetensors"), "--output-dir", str(out), cwd=tmp_path
    )
    assert code == 2, text
    assert "lm_head.dense.weight holds NaN or Inf" in text
    assert not out.exists()


CHEAP_MODULES = (
    "bionemo.core",
    "bionemo.core.megatron_env",
    "bionemo.core.skip_torchmetrics_imports",
    "bionemo.core.skip_megatron_timer_writers",
    "bionemo.core.defer_megatron_compile",
    "bionemo.core.cuda_devices",
    "bionemo.core.safetensors_header",
    "bionemo.esm2",
    "bionemo.esm2.hf",
    "bionemo.esm2.model",
    "bionemo.esm2.data",
    "bionemo.esm2.data.readers",
    "bionemo.esm2.checkpoints",
    "bionemo.esm2.checkpoints.header",
    "bionemo.esm2.recipes",
    "bionemo.esm2.recipes.model_settings",
    "bionemo.esm2.recipes.inputs",
    "bionemo.esm2.recipes.train",
    "bionemo.esm2.recipes.predict",
    "bionemo.recipes.trainers",
    "bionemo.cli.app",
)


def test_the_modules_that_check_input_import_nothing_heavy():
    code = (
        f"import importlib, sys\nfor name in {CHEAP_MODULES!r}:\n    importlib.import_module(name)\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert result.stdout.strip() == "[]"


def test_the_model_keys_accepted_without_importing_esm2config_are_its_fields():
    import dataclasses

    from bionemo.esm2.model import ESM2Config
    from bionemo.esm2.recipes import MODEL_KEYS

    assert MODEL_KEYS.issubset(field.name for field in dataclasses.fields(ESM2Config))


def test_checking_the_output_dir_without_creating_it_refuses_what_creating_would(tmp_path):
    from bionemo.recipes.settings import SettingsError
    from bionemo.recipes.trainers import check_output_dir

    (tmp_path / "file").write_text("x")
    refused = [(tmp_path / "file", "is an existing file"), (tmp_path / "file" / "sub", "cannot be created: Not a dir")]
    if os.geteuid() != 0:  # root writes through directory permissions
        (tmp_path / "locked").mkdir(mode=0o500)
        refused += [(tmp_path / "locked", "is not writable"), (tmp_path / "locked" / "sub", "Permission denied")]
    for path, message in refused:
        for create in (False, True):
            with pytest.raises(SettingsError, match=message):
                check_output_dir(path, create=create)
    new = tmp_path / "a" / "b"
    check_output_dir(new, create=False)
    assert not (tmp_path / "a").exists()
    check_output_dir(new)
    assert new.is_dir()
    check_output_dir(new, create=False)
