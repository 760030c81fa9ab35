"""Every benchmark under ``tools/`` runs at the tiny size its docstring documents and prints its figure line.

The figures themselves are not checked (they are measurements, kept in ``docs/benchmarks.md``); what fails here is
a script that no longer runs, exits non-zero, or stops printing what it measures. The arguments come from the
script's own ``CPU smoke:`` (or ``GPU smoke``) docstring line, so the documented command is the one tested.
The selected smoke runs start together, two at a time (``support.cli_runs.two_at_a_time``'s reasoning: a run is
mostly one core's imports), and each test waits for its own.
"""

import ast
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
DOCS = ROOT / "docs" / "benchmarks.md"

FIGURE_LINES = {
    "bench_cli_startup": r"bionemo --help +\d+\.\d+ +\d+\.\d+",
    "bench_collator": r"batch_collator +\d+\.\d+ +\d+\.\d+ +\d+\.\d+",
    "bench_finetune": r"demo lora: ours [\d,]+ tokens/s.*ratio \d+\.\d+x\n.*demo lora predict: \d+ rows .* max gap \d",
    "bench_finetune_heads": r"best head for token-classification: (hf|conv) \(mean val_accuracy \d\.\d+ vs",
    "bench_imports": r"bionemo\.losses +\d+\.\d+ +torch",
    "bench_input_errors": r"slowest case: \d+\.\d+ s \((within|OVER) the 3 s target\)",
    "bench_layer_norm": r"forward \+ backward +torch +\d+\.\d+ us",
    "bench_varlen_attention": r"fused, \(\d+, \d+, \d+, \d+\), keys rotated (first|in the loop) +\d+\.\d+ ms .*x",
    "bench_perplexity_memory": r"PerplexityLoggingCallback +[\d,]+ B +\d+\.\d+%",
    "bench_predict": (
        r"by phase +inputs \d+\.\d+.* loop \d+\.\d+.*\n(.*\n)*"
        r".*ratio ours \(1 device\) / HF best \(target >= 3\.0\) +\d+\.\d+"
    ),
    "bench_predict_memory": r"peak tree memory, largest / smallest input: \d+\.\d+x",
    "bench_predict_startup": r"exit after the command +\d+\.\d+",
    "bench_pseudo_perplexity": r"512 tokens per forward: +\d+\.\d+ s",
    "bench_recipe_throughput": r"sdpa +\d+\.\d+ ms/step .* of peak",
}
"""The line each script prints its figure on: the tests require it in the smoke run's output."""

GPU_ONLY = {"bench_layer_norm", "bench_recipe_throughput", "bench_varlen_attention"}
"""Scripts that need CUDA (Triton kernels, bf16 peak FLOP/s): smoke-run on the GPU tier only."""


def _tools() -> list[str]:
    return sorted(path.stem for path in TOOLS.glob("*.py"))


def _smoke_args(name: str) -> list[str]:
    """The arguments of the ``CPU smoke:`` / ``GPU smoke ...:`` line of ``tools/<name>.py``'s docstring."""
    doc = ast.get_docstring(ast.parse((TOOLS / f"{name}.py").read_text())) or ""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"(``)?(CPU|GPU) smoke[^:]*:", line))
    command = lines[start].split(":", 1)[1]
    for line in lines[start + 1 :]:  # continuation lines are indented
        if not line.startswith("    "):
            break
        command += " " + line.strip()
    words = shlex.split(command.replace("``", ""))
    script = next(i for i, word in enumerate(words) if word.endswith(f"tools/{name}.py"))
    return words[script + 1 :]


def _param(name: str) -> object:
    marks = [pytest.mark.gpu] if name in GPU_ONLY else []
    return pytest.param(name, id=name, marks=marks)


def test_every_tool_has_a_smoke_run_a_figure_line_and_a_benchmarks_section() -> None:
    docs = DOCS.read_text()
    assert set(_tools()) == set(FIGURE_LINES), "a tool without a smoke test, or a smoke test without its tool"
    for name in _tools():
        assert _smoke_args(name), f"tools/{name}.py: no 'CPU smoke:' / 'GPU smoke:' line in its docstring"
        assert f"tools/{name}.py" in docs, f"tools/{name}.py has no figure in docs/benchmarks.md"


def _smoke_run(name: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOLS / f"{name}.py"), *_smoke_args(name)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture(scope="module")
def smoke_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future]]:
    """The smoke run of every tool this session runs (not deselected, not skipped), started two at a time."""
    names = [
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_tool_runs_tiny_and_prints_its_figure"
        and not item.get_closest_marker("skip")
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {name: pool.submit(_smoke_run, name, tmp_path_factory.mktemp(name)) for name in names}


@pytest.mark.parametrize("name", [_param(name) for name in sorted(FIGURE_LINES)])
def test_tool_runs_tiny_and_prints_its_figure(name: str, smoke_runs: dict[str, Future]) -> None:
    result = smoke_runs[name].result()
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"tools/{name}.py exited {result.returncode}:\n{output[-4000:]}"
    assert re.search(FIGURE_LINES[name], result.stdout), f"tools/{name}.py printed no figure line:\n{output[-4000:]}"


@pytest.mark.parametrize("name", sorted(GPU_ONLY))
def test_gpu_only_tools_import_and_parse_their_options_on_the_cpu(name: str, tmp_path: Path) -> None:
    """CI has no GPU: it still imports each CUDA-only script and parses its smoke line's options (``--help``)."""
    result = subprocess.run(
        [sys.executable, str(TOOLS / f"{name}.py"), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    options = {word.split("=", 1)[0] for word in _smoke_args(name) if word.startswith("--")}
    assert options, name
    assert all(option in result.stdout for option in options), (options, result.stdout)
