"""No import cycle among the modules of any package (``bionemo.<pkg>``).

An edge ``a -> b`` is an import of ``bionemo.<pkg>.b`` (or of a name from it) written in ``a``; imports inside
``if TYPE_CHECKING:`` never run and are not edges. Importing ``a.b.c`` also runs ``a/__init__`` and
``a/b/__init__``; those implicit edges are left out (with them every re-exporting ``__init__`` would be a cycle),
but ``from bionemo.<pkg> import name`` of a name that is not a submodule is an edge to the package's
``__init__``.

Two graphs are checked:

- imports that run when the module is imported (module, class, ``try``/``if`` bodies): no cycle at all;
- those plus the imports inside functions, which defer a cycle to call time rather than remove it: no cycle
  beyond :data:`KNOWN_DEFERRED_CYCLES`, which lists today's to be removed (a fixed one must leave the list).
"""

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(
    path.relative_to(path.parents[1]).as_posix().replace("/", ".")
    for path in (ROOT / "packages").glob("*/src/bionemo/*")
    if path.is_dir() and path.name != "__pycache__"
)
"""Every ``bionemo.<pkg>`` of the workspace (a distribution may hold more than one)."""

KNOWN_DEFERRED_CYCLES: dict[str, frozenset[str]] = {}
"""Cycles (as the set of modules each strongly connected part holds) closed only by imports inside functions."""


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(body: list[ast.stmt], *, in_functions: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``body`` that run on import (and, with ``in_functions``, those in functions)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if in_functions:
                yield from (n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom))
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _imports(node.body, in_functions=in_functions)
            yield from _imports(node.orelse, in_functions=in_functions)
        elif isinstance(node, ast.Try | ast.TryStar):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _imports(block, in_functions=in_functions)
        elif isinstance(node, ast.ClassDef | ast.With | ast.For | ast.While):
            yield from _imports(node.body, in_functions=in_functions)


def _modules(package: str, root: Path) -> dict[str, tuple[Path, bool]]:
    """Each module of ``package`` (``bionemo.x``): its file and whether it is a package's ``__init__``."""
    (folder,) = (root / "packages").glob(f"*/src/{package.replace('.', '/')}")
    src = folder.parents[1]
    found = {}
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_init = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return found


def import_graph(package: str, *, in_functions: bool, root: Path = ROOT) -> dict[str, set[str]]:
    """The modules of ``package`` each module imports (see the module docstring for what counts)."""
    modules = _modules(package, root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_init) in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _imports(tree.body, in_functions=in_functions):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_init else name.split(".")[:-1]
                    here = here[: len(here) - node.level + 1]
                    base = ".".join([*here, *([node.module] if node.module else [])])
                submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
                # ``from p import m`` of a submodule ``m`` runs only ``p.m``; any other name comes from ``p/__init__``
                targets = [*submodules, *([base] if len(submodules) < len(node.names) else [])]
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected parts of ``graph`` with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            child = next(successors, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.add(member)
                        if member == node:
                            break
                    if len(part) > 1:
                        found.append(frozenset(part))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def _describe(graph: dict[str, set[str]], part: frozenset[str]) -> str:
    edges = [f"{a} -> {b}" for a in sorted(part) for b in sorted(graph[a] & part)]
    return "\n  ".join(edges)


def test_the_cycle_finder_finds_a_cycle_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_what_counts_as_an_edge(tmp_path):
    src = tmp_path / "packages" / "bionemo-toy" / "src" / "bionemo" / "toy"
    (src / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from bionemo.toy.a import A\n",
        "a.py": "from typing import TYPE_CHECKING\nfrom . import b\nif TYPE_CHECKING:\n    from bionemo.toy import c\n",
        "b.py": "import os\ntry:\n    from .sub.d import D\nexcept ImportError:\n    D = None\n",
        "c.py": "def late():\n    from bionemo.toy import a\n",
        "sub/__init__.py": "",
        "sub/d.py": "from .. import c\nfrom bionemo.toy import A\nfrom bionemo.toy.sub import e\n",
        "sub/e.py": "",
    }
    for name, text in files.items():
        (src / name).write_text(text)
    graph = import_graph("bionemo.toy", in_functions=False, root=tmp_path)
    assert graph == {
        "bionemo.toy": {"bionemo.toy.a"},
        "bionemo.toy.a": {"bionemo.toy.b"},  # b is a submodule; not c: only under TYPE_CHECKING
        "bionemo.toy.b": {"bionemo.toy.sub.d"},
        "bionemo.toy.c": set(),
        "bionemo.toy.sub": set(),
        "bionemo.toy.sub.d": {"bionemo.toy", "bionemo.toy.c", "bionemo.toy.sub.e"},  # A is no module: __init__
        "bionemo.toy.sub.e": set(),
    }
    assert cycles(graph) == [frozenset({"bionemo.toy", "bionemo.toy.a", "bionemo.toy.b", "bionemo.toy.sub.d"})]
    deferred = import_graph("bionemo.toy", in_functions=True, root=tmp_path)
    assert deferred["bionemo.toy.c"] == {"bionemo.toy.a"}
    assert cycles(deferred) == [
        frozenset({"bionemo.toy", "bionemo.toy.a", "bionemo.toy.b", "bionemo.toy.c", "bionemo.toy.sub.d"})
    ]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_among_modules(package):
    graph = import_graph(package, in_functions=False)
    found = cycles(graph)
    assert not found, f"{package} has import cycles:\n  " + "\n\n  ".join(_describe(graph, part) for part in found)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_new_cycle_through_imports_inside_functions(package):
    graph = import_graph(package, in_functions=True)
    found = set(cycles(graph))
    known = {
        part
        for part in KNOWN_DEFERRED_CYCLES.values()
        if all(module == package or module.startswith(f"{package}.") for module in part)
    }
    new = found - known
    assert not new, f"{package}: new import cycles (counting imports inside functions):\n  " + "\n\n  ".join(
        _describe(graph, part) for part in new
    )
    gone = known - found
    assert not gone, (
        f"{package}: a known cycle changed or is gone; update KNOWN_DEFERRED_CYCLES: {sorted(map(sorted, gone))}"
    )
