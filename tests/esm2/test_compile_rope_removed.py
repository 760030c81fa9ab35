"""``compile_rope`` was a model setting that did nothing; it is gone, and setting it is an unknown-setting error."""

import dataclasses
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from bionemo.cli.app import app
from bionemo.esm2 import recipes

runner = CliRunner()


def flat(output: str) -> str:
    for border in "│╭╮╰╯─":
        output = output.replace(border, " ")
    return " ".join(output.split())


def test_compile_rope_is_no_model_setting():
    from bionemo.esm2.model import ESM2Config

    assert "compile_rope" not in recipes.MODEL_KEYS
    assert "compile_rope" not in {field.name for field in dataclasses.fields(ESM2Config)}
    with pytest.raises(ValueError, match=r"unknown model settings \['compile_rope'\]"):
        recipes.ESM2Recipe(
            name="x", description="", defaults=replace(recipes.demo().defaults, model={"compile_rope": True})
        )


def test_a_config_that_sets_compile_rope_exits_2_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  compile_rope: true\n")
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["run", "train", "--config", str(config), "--max-steps", "1", "--output-dir", str(out), "--accelerator", "cpu"],
        terminal_width=300,
    )
    assert result.exit_code == 2, result.output
    assert "unknown model settings ['compile_rope']" in flat(result.output)
    assert not out.exists()
