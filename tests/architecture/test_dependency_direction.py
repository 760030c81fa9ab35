"""Dependencies flow one way: core <- collate <- losses <- layers <- callbacks <- lightning <- recipes <- esm2 <- cli.

Checks both what each package's source imports and what its pyproject declares. ``layers`` (model building
blocks on megatron-core: SDPA attention, RoPE, LayerNorm, fused-bias linears, context parallelism, LoRA) sits below
``lightning``: it may use torch, megatron-core and (optionally) Triton, never Lightning or NeMo.
"""

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORDER = ["core", "collate", "losses", "layers", "callbacks", "lightning", "recipes", "esm2", "cli"]

# Third-party imports each package may make (import name -> distribution), cumulative along ORDER.
THIRD_PARTY = {
    "core": {"torch": "torch", "safetensors": "safetensors"},
    "collate": {},
    "losses": {"megatron": "megatron-core"},
    "layers": {},
    "callbacks": {"lightning": "lightning"},
    "lightning": {"nemo": "nemo-toolkit"},
    "recipes": {"pydantic": "pydantic", "yaml": "pyyaml", "matplotlib": "matplotlib"},
    "esm2": {"rich": "rich", "torchmetrics": "torchmetrics"},
    "cli": {"typer": "typer", "rich": "rich"},
}
# Where an indirect dependency is imported directly, it must be declared: lightning pulls these in.
IMPLIED = {"typing_extensions", "numpy"}
# Optional: imported only where installed (triton comes with torch's CUDA wheels; bionemo.layers.rotary and
# bionemo.layers.layer_norm check for it before importing their kernel modules), so not declared. bionemo.core's
# torchmetrics work-around (skip_torchmetrics_imports) imports lightning_utilities only while torchmetrics, which
# requires it, is being imported.
OPTIONAL = {"core": {"lightning_utilities"}, "layers": {"triton"}}


def allowed_imports(package: str) -> dict[str, str]:
    allowed: dict[str, str] = {}
    for name in ORDER[: ORDER.index(package) + 1]:
        allowed.update(THIRD_PARTY[name])
    return allowed


def imported_top_levels(package: str) -> dict[str, set[str]]:
    """Map every absolute import in distribution ``bionemo-<package>`` to the files importing it."""
    src = ROOT / "packages" / f"bionemo-{package}" / "src" / "bionemo"
    found: dict[str, set[str]] = {}
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                parts = name.split(".")
                key = ".".join(parts[:2]) if parts[0] == "bionemo" else parts[0]
                found.setdefault(key, set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("package", ORDER)
def test_source_imports_follow_the_direction(package):
    import sys

    allowed_bionemo = {
        f"bionemo.{sub.name}"
        for name in ORDER[: ORDER.index(package) + 1]
        for sub in (ROOT / "packages" / f"bionemo-{name}" / "src" / "bionemo").iterdir()
        if sub.is_dir() and sub.name != "__pycache__"
    }
    allowed_third = allowed_imports(package)
    violations = []
    for name, files in imported_top_levels(package).items():
        if name.startswith("bionemo"):
            if name not in allowed_bionemo:
                violations.append(f"{name} imported by {sorted(files)}")
        elif name in sys.stdlib_module_names or name in IMPLIED | OPTIONAL.get(package, set()) or name == "__future__":
            continue
        elif name not in allowed_third:
            violations.append(f"{name} imported by {sorted(files)}")
    assert not violations, f"bionemo.{package} imports against the dependency direction: {violations}"


def declared(package: str) -> set[str]:
    """Normalized distribution names that ``bionemo-<package>`` lists under ``[project] dependencies``."""
    meta = tomllib.loads((ROOT / "packages" / f"bionemo-{package}" / "pyproject.toml").read_text())
    return {
        re.split(r"[\[=<>!~; ]", dep, maxsplit=1)[0].lower().replace("_", "-")
        for dep in meta["project"]["dependencies"]
    }


@pytest.mark.parametrize("package", ORDER)
def test_declared_dependencies_follow_the_direction(package):
    allowed = {f"bionemo-{name}" for name in ORDER[: ORDER.index(package)]}
    allowed |= set(allowed_imports(package).values())
    extra = declared(package) - allowed
    assert not extra, f"bionemo-{package} declares dependencies it may not have: {sorted(extra)}"
    # Every third-party package the source imports is declared by this package or one below it.
    third = allowed_imports(package)
    needed = {third[name] for name in imported_top_levels(package) if name in third}
    available = set().union(*(declared(name) for name in ORDER[: ORDER.index(package) + 1]))
    assert needed <= available, f"bionemo-{package} imports undeclared {sorted(needed - available)}"


def test_every_package_has_its_place_in_the_order():
    """A new ``packages/bionemo-*`` folder must be placed in ``ORDER``, or its imports would go unchecked."""
    folders = {path.name.removeprefix("bionemo-") for path in (ROOT / "packages").glob("bionemo-*") if path.is_dir()}
    assert folders == set(ORDER)
    assert set(THIRD_PARTY) == set(ORDER)


def test_namespace_package_has_no_init():
    for package in ORDER:
        src = ROOT / "packages" / f"bionemo-{package}" / "src" / "bionemo"
        assert not (src / "__init__.py").exists(), f"{src}/__init__.py breaks the PEP 420 namespace"


def _private_imports(paths) -> list[str]:
    """``bionemo.<pkg>._<private>`` imported from outside ``<pkg>``: where each such import is."""
    found = []
    for path in paths:
        own = path.relative_to(ROOT).parts
        owner = own[4] if own[0] == "packages" and len(own) > 5 else None  # packages/bionemo-x/src/bionemo/<x>/...
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            for module in modules:
                parts = module.split(".")
                private = len(parts) > 2 and parts[0] == "bionemo" and parts[2].startswith("_")
                if private and parts[1] != owner:
                    found.append(f"{path.relative_to(ROOT)} imports {module}")
    return found


def test_no_package_imports_another_packages_private_module():
    assert _private_imports((ROOT / "packages").rglob("src/bionemo/**/*.py")) == []
