import subprocess
import sys

from typer.testing import CliRunner

from bionemo.cli.app import app

runner = CliRunner()


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "packages" in result.output


def test_version_lists_every_distribution():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    for name in ("core", "collate", "losses", "callbacks", "lightning", "cli"):
        assert f"bionemo-{name} 0.1.0" in result.output


def test_help_imports_no_heavy_module():
    code = (
        "import sys\n"
        "from bionemo.cli.app import app\n"
        "try:\n"
        "    app(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'lightning', 'nemo', 'megatron'})\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in result.stdout


def test_python_dash_m_runs_the_app():
    result = subprocess.run(
        [sys.executable, "-m", "bionemo.cli", "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    assert "Usage" in result.stdout
