"""The command surface: flags are pinned, recipes are listed, bad input exits 2 with a one-screen error."""

import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.esm2.recipes import BUNDLED_CHECKPOINT

runner = CliRunner()


def flat(output: str) -> str:
    """The CLI output as one line, without the error box's borders (rich wraps long messages)."""
    for border in "│╭╮╰╯─":
        output = output.replace(border, " ")
    return " ".join(output.split())


SHARED = {
    "--recipe", "--config", "--data", "--output-dir", "--checkpoint", "--devices", "--num-nodes", "--accelerator",
    "--strategy", "--tensor-parallel", "--pipeline-parallel", "--context-parallel", "--precision",
    "--micro-batch-size", "--global-batch-size", "--truncate", "--verbose",
}  # fmt: skip
TRAIN_ONLY = {"--max-steps", "--val-check-interval", "--lr", "--no-resume", "--seed", "--global-batch-tokens"}
PREDICT_ONLY = {
    "--include", "--write-interval", "--layer", "--output-dtype", "--tokens-per-batch", "--unpadded", "--overwrite",
}  # fmt: skip


def option_names(command_name: str) -> set[str]:
    import typer.main

    group = typer.main.get_command(app)
    command = group.commands["run"].commands[command_name]  # type: ignore[attr-defined]
    names = set()
    for param in command.params:
        names.update(n for n in param.opts if n.startswith("--"))
    return names - {"--help"}


def test_flag_surface_is_pinned():
    assert option_names("train") == SHARED | TRAIN_ONLY
    assert option_names("predict") == SHARED | PREDICT_ONLY


@pytest.mark.parametrize("command_name", ["train", "predict"])
def test_help_fits_80_columns_with_whole_option_names_and_help_for_each(command_name):
    import typer.main

    result = runner.invoke(app, ["run", command_name, "--help"], terminal_width=80)
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    shown = {word for line in lines for word in line.replace("│", " ").split() if word.startswith("--")}
    assert option_names(command_name) <= shown  # no name cut to "--pipeline-parall…"
    command = typer.main.get_command(app).commands["run"].commands[command_name]  # type: ignore[attr-defined]
    assert [p.name for p in command.params if not getattr(p, "help", None)] == []


def test_recipes_list_and_show():
    result = runner.invoke(app, ["recipes", "list"])
    assert result.exit_code == 0
    assert "esm2-demo" in result.output
    assert "esm2-gpu" in result.output
    for name, size in (("esm2-8m", "8M"), ("esm2-650m", "651M"), ("esm2-3b", "2.8B"), ("esm2-15b", "15.1B")):
        assert name in result.output
        assert size in result.output  # parameter counts, as Hugging Face counts them (no contact head)
    shown = runner.invoke(app, ["recipes", "show", "esm2-gpu"])
    assert shown.exit_code == 0
    config = json.loads(shown.output)
    assert config["model"]["num_layers"] == 12
    assert config["precision"] == "bf16-mixed"
    assert runner.invoke(app, ["recipes", "show", "nope"]).exit_code == 2


def test_shown_settings_work_as_a_config_file_and_options_override_them(tmp_path):
    from bionemo.recipes.settings import RunSettings

    shown = runner.invoke(app, ["recipes", "show", "esm2-demo"])
    path = tmp_path / "settings.json"
    path.write_text(shown.output)
    settings = RunSettings.resolve(path, {"max_steps": 7, "lr": None})
    assert settings.recipe == "esm2-demo"
    assert settings.max_steps == 7  # the option wins
    assert settings.lr == json.loads(shown.output)["lr"]  # an option not given keeps the file's value
    assert settings.model is not None
    assert settings.model["num_layers"] == 4
    yaml_path = tmp_path / "settings.yaml"
    yaml_path.write_text("micro-batch-size: 3\nmodel:\n  num_layers: 2\n")
    assert RunSettings.resolve(yaml_path, {}).micro_batch_size == 3


def test_unknown_model_settings_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  num_layerz: 2\n")
    result = runner.invoke(app, ["run", "train", "--config", str(path)], terminal_width=300)
    assert result.exit_code == 2
    assert "unknown model settings ['num_layerz']" in flat(result.output)
    predict = runner.invoke(app, ["run", "predict", "--config", str(path)], terminal_width=300)
    assert predict.exit_code == 2
    assert "prediction reads the model from --checkpoint" in flat(predict.output)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    long = "A" * 1100  # the demo model takes up to 1022 residues
    corrupted = tmp / "corrupted.safetensors"
    corrupted.write_bytes(b"\x00\x01 not a safetensors file")
    readonly = tmp / "readonly"
    readonly.mkdir()
    readonly.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return [
        (["--data", str(tmp / "missing.fasta")], "does not exist"),
        (["--data", str(write(tmp / "empty.fasta", ""))], "holds no sequences"),
        (["--data", str(write(tmp / "noheader.fasta", "MKV\n"))], "before the first '>' header"),
        (["--data", str(write(tmp / "bad.fasta", ">a\nMKV1Z\n"))], "characters ['1'] outside the amino-acid alphabet"),
        (["--data", str(write(tmp / "dup.fasta", ">a\nMKV\n>a\nMKV\n"))], "appears more than once"),
        (["--data", str(write(tmp / "long.fasta", f">big\n{long}\n"))], "pass --truncate"),
        (["--data", str(write(tmp / "nocol.csv", "id,seq\na,MKV\n"))], "'sequence' column"),
        (["--data", str(write(tmp / "x.txt", "MKV"))], "use .fasta"),
        (["--recipe", "nope"], "unknown recipe 'nope'"),
        (["--checkpoint", str(tmp / "missing.safetensors")], "does not exist"),
        (["--checkpoint", str(corrupted)], "not a readable safetensors file"),
        (["--output-dir", str(readonly / "sub")], "cannot be created"),
        (["--accelerator", "gpu"], "no CUDA GPU"),
        (["--devices", "3", "--tensor-parallel", "2"], "not divisible"),
        (["--tensor-parallel", "2", "--devices", "2"], "need --strategy megatron"),
        (["--strategy", "megatron", "--accelerator", "cpu"], "needs GPUs"),
        (["--config", str(write(tmp / "c.yaml", "devicez: 2\n"))], "devicez"),
        (["--config", str(write(tmp / "c2.json", '{"devices": 0}'))], "devices"),
        (["--config", str(tmp / "nofile.yaml")], "does not exist"),
        (["--data", str(write(tmp / "gap.fasta", ">a\nMK-V.\n"))], "gap '-' at residue 3 (2 gap(s) in all)"),
        (["--recipe", "esm2-gpu"], "but recipe esm2-gpu has num_layers=12"),
        (["--checkpoint", str(write(tmp / "last.ckpt", "x"))], "is a training checkpoint"),
        (["--output-dir", str(write(tmp / "afile", "x"))], "is an existing file, not a directory"),
    ]


@pytest.mark.parametrize("index", range(23))
def test_bad_input_exits_2_with_a_clear_message_and_no_output(tmp_path, index, monkeypatch):
    from bionemo.core import cuda_devices

    monkeypatch.chdir(tmp_path)
    # a machine without GPUs, also where the suite runs on a GPU host (some of these errors are GPU-less ones)
    monkeypatch.setattr(cuda_devices, "cuda_device_count", lambda: 0)
    monkeypatch.setattr(cuda_devices, "cuda_available", lambda: False)
    args, message = bad_inputs(tmp_path)[index]
    if os.geteuid() == 0 and "cannot be created" in message:  # root writes through directory permissions
        args = ["--output-dir", "/proc/bionemo-cannot-exist"]
    out = tmp_path / "out"
    if "--output-dir" not in args:
        args = [*args, "--output-dir", str(out)]
    result = runner.invoke(app, ["run", "predict", *args], terminal_width=400)
    assert result.exit_code == 2, result.output
    assert message in flat(result.output), result.output
    assert len(result.output.splitlines()) < 25
    assert not (out / "predictions.safetensors").exists()
    assert not (out / "shards").exists()


def test_truncate_lets_long_sequences_through_validation(tmp_path):
    from bionemo.esm2.data.readers import read_sequences

    path = write(tmp_path / "long.fasta", f">big\n{'A' * 200}\n")
    (record,) = read_sequences(path, max_length=128, truncate=True)
    assert len(record.sequence) == 128


def test_fasta_stop_marker_byte_order_mark_and_truncation_are_handled(tmp_path):
    from bionemo.esm2.data.readers import read_sequences

    path = tmp_path / "uniprot.fasta"
    path.write_bytes("\ufeff>a\nMKV*\n>b\nMKVLA*\n".encode())
    records = read_sequences(path, max_length=4, truncate=True)
    assert [(r.id, r.sequence, r.truncated_from) for r in records] == [("a", "MKV", None), ("b", "MKVL", 5)]
    csv_path = tmp_path / "bom.csv"
    csv_path.write_bytes("\ufeffid,sequence\nx,MKV*\n".encode())
    assert [r.sequence for r in read_sequences(csv_path)] == ["MKV"]


def test_bundled_checkpoint_ships_with_the_package():
    assert BUNDLED_CHECKPOINT.is_file()
    assert BUNDLED_CHECKPOINT.stat().st_size < 2_000_000


def test_recipes_from_another_package_are_found_through_entry_points(monkeypatch):
    from importlib.metadata import EntryPoint

    import bionemo.recipes.registry as recipe_module

    extra = EntryPoint(name="my-model", value="bionemo.esm2.recipes:gpu", group=recipe_module.ENTRY_POINT_GROUP)
    monkeypatch.setattr(recipe_module, "entry_points", lambda group: [extra] if group == extra.group else [])
    assert recipe_module.available_recipes()["my-model"] == "bionemo.esm2.recipes:gpu"
    assert recipe_module.load_recipe("my-model").name == "esm2-gpu"
    listed = runner.invoke(app, ["recipes", "list"])
    assert "my-model" in listed.output


def test_unset_flags_leave_the_config_file_in_charge(monkeypatch):
    import bionemo.cli.run as run_module

    seen, verbose = {}, {}

    def fake_run(command, file, overrides, is_verbose, ctx=None):
        seen[command], verbose[command] = overrides, is_verbose

    monkeypatch.setattr(run_module, "_run", fake_run)
    assert runner.invoke(app, ["run", "train"]).exit_code == 0
    assert runner.invoke(app, ["run", "predict", "--truncate"]).exit_code == 0
    assert (seen["train"]["truncate"], seen["train"]["resume"]) == (None, None)
    assert seen["predict"]["truncate"] is True
    assert runner.invoke(app, ["run", "train", "--no-resume", "--truncate"]).exit_code == 0
    assert (seen["train"]["truncate"], seen["train"]["resume"]) == (True, False)
    assert "no_resume" not in seen["train"]
    assert verbose == {"train": False, "predict": False}
    assert runner.invoke(app, ["run", "predict", "--verbose"]).exit_code == 0
    assert verbose["predict"] is True
    assert "verbose" not in seen["predict"]  # not a setting: a config file cannot hold it


def test_a_config_typo_names_the_setting_and_the_valid_ones(tmp_path):
    config = tmp_path / "typo.json"
    config.write_text('{"micro_batch_sise": 4}')
    result = runner.invoke(app, ["run", "predict", "--config", str(config)], terminal_width=400)
    assert result.exit_code == 2
    text = " ".join(result.output.replace("│", " ").split())
    assert "unknown setting 'micro_batch_sise'" in text
    assert "did you mean 'micro_batch_size'" in text
    assert "valid settings: accelerator, best_metric, checkpoint," in text
    assert "--micro-batch-sise" not in text  # no option that does not exist
    assert "'--config'" in text
