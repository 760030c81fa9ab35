"""Every flag a message, a help text or the README names exists, and the messages say what the README says."""

import ast
import re
from pathlib import Path

import typer.main
from typer.testing import CliRunner

from bionemo.cli.app import app
from support.hf_esm import random_hf_esm

ROOT = Path(__file__).parents[2]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")

LAUNCHERS = {
    "--help": "every command",
    "--check": "ruff format",
    "--compile-bytecode": "uv sync",
    "--index-url": "uv / pip",
    "--torch-backend": "uv pip",
    "--nnodes": "torchrun",
    "--nproc-per-node": "torchrun",
    "--rdzv-backend": "torchrun",
    "--rdzv-endpoint": "torchrun",
    "--nodes": "srun / sbatch",
    "--ntasks-per-node": "srun / sbatch",
    "--gpus-per-node": "srun / sbatch",
    "--mpi": "srun (its PMI plug-in, named where MPI launchers are told apart)",
}
"""Flags of the tools the README and the launch messages show around `bionemo` (uv, ruff, torchrun, SLURM)."""

FINETUNE = {"--task", "--label-column", "--mask-column", "--head", "--val-data", "--encoder"}
"""Flags of `bionemo run finetune` that `bionemo.esm2.finetune`'s messages name: options of that command (the last
test here), so the first test finds them among `bionemo`'s own flags without an allowance."""

runner = CliRunner()


def bionemo_flags() -> set[str]:
    flags: set[str] = set()
    pending = [typer.main.get_command(app)]
    while pending:
        command = pending.pop()
        for param in getattr(command, "params", []):
            flags.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("--"))
        pending.extend(getattr(command, "commands", {}).values())
    return flags


def tool_flags() -> set[str]:
    """The argparse options of the benchmarks under tools/ (the README's benchmark table runs them)."""
    flags = set()
    for script in (ROOT / "tools").glob("*.py"):
        for call in re.finditer(r"add_argument\(\s*((?:\"--[\w-]+\",\s*)+)", script.read_text()):
            for flag in re.findall(r"--[\w-]+", call.group(1)):
                flags.add(flag)
        if "BooleanOptionalAction" in script.read_text():
            flags.update("--no-" + f[2:] for f in list(flags))
    return flags


def source_strings() -> dict[str, set[str]]:
    """Flags named in any string of the packages' code (messages, help texts, docstrings), by file."""
    named: dict[str, set[str]] = {}
    for path in sorted((ROOT / "packages").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for flag in FLAG.findall(node.value):
                    named.setdefault(flag, set()).add(str(path.relative_to(ROOT)))
    return named


def test_every_flag_the_code_names_is_an_option_of_bionemo_or_of_a_launcher():
    valid = bionemo_flags() | set(LAUNCHERS) | tool_flags()
    unknown = {flag: sorted(files) for flag, files in source_strings().items() if flag not in valid}
    assert unknown == {}


def test_every_flag_the_readme_names_exists():
    valid = bionemo_flags() | set(LAUNCHERS) | tool_flags()
    unknown = sorted(set(FLAG.findall((ROOT / "README.md").read_text())) - valid)
    assert unknown == []


def test_the_readme_gives_the_residue_limit_the_error_gives(tmp_path):
    from bionemo.esm2.catalog import ESM2_SHAPES

    (limit,) = {shape.seq_length - 2 for shape in ESM2_SHAPES.values()}
    stated = re.search(r"All accept (\d[\d,]*) residues", (ROOT / "README.md").read_text())
    assert stated is not None
    assert int(stated.group(1).replace(",", "")) == limit
    fasta = tmp_path / "long.fasta"
    fasta.write_text(f">long\n{'A' * (limit + 1)}\n")
    result = runner.invoke(app, ["run", "predict", "--data", str(fasta)], terminal_width=300)
    assert result.exit_code == 2
    assert f"more than the model's {limit}" in " ".join(result.output.replace("│", " ").split())


def test_a_hugging_face_weights_file_as_checkpoint_is_told_to_give_its_folder(tmp_path):
    folder = tmp_path / "hf"
    random_hf_esm(folder, hidden=32, heads=2, layers=1)
    result = runner.invoke(
        app, ["run", "predict", "--checkpoint", str(folder / "model.safetensors")], terminal_width=300
    )
    message = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2, message
    assert "is a Hugging Face weights file" in message
    assert f"giveitsfolder{folder}" in message.replace(" ", "")  # rich folds long paths
    assert "Expecting value" not in message


def test_the_finetune_flags_the_messages_name_are_its_options():
    commands = typer.main.get_command(app).commands["run"].commands  # type: ignore[attr-defined]
    assert "finetune" in commands
    names = {o for p in commands["finetune"].params for o in p.opts}
    assert names >= FINETUNE, sorted(FINETUNE - names)
    named = source_strings()
    assert all(flag in named for flag in FINETUNE), sorted(FINETUNE - set(named))  # the messages still name them
