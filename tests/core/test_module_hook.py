"""The one-shot import hook (bionemo.core.module_hook): one module, its first import, then gone."""

import importlib
import sys

import pytest

from bionemo.core.module_hook import ModuleHook, hook_module, module_hooked


@pytest.fixture
def package(tmp_path, monkeypatch):
    """Two fresh modules on ``sys.path``; ``sys.meta_path`` and ``sys.modules`` restored after."""
    (tmp_path / "hooked_target.py").write_text("VALUE = 1\nSEEN = globals().get('PRESET')\n")
    (tmp_path / "hooked_other.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for name in ("hooked_target", "hooked_other"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_the_module_runs_inside_around_once_and_the_hook_leaves(package):
    calls = []

    def around(exec_module, module):
        module.PRESET = "set before"
        exec_module(module)
        module.VALUE += 1
        calls.append(module.__name__)

    hook_module("hooked_target", around)
    hook_module("hooked_target", around)  # already waiting: not added twice
    assert sum(isinstance(f, ModuleHook) and f.fullname == "hooked_target" for f in sys.meta_path) == 1
    importlib.import_module("hooked_other")  # another module: not run through the hook

    assert module_hooked("hooked_target")
    assert calls == []
    hooked_target = importlib.import_module("hooked_target")

    assert (hooked_target.VALUE, hooked_target.SEEN, calls) == (2, "set before", ["hooked_target"])
    assert not module_hooked("hooked_target")
    del sys.modules["hooked_target"]
    again = importlib.import_module("hooked_target")  # a second import: the module's own code only

    assert (again.VALUE, calls) == (1, ["hooked_target"])


def test_an_error_inside_the_module_propagates_and_the_hook_is_still_gone(package):
    (package / "hooked_target.py").write_text("raise ValueError('upstream failed')\n")
    hook_module("hooked_target", lambda exec_module, module: exec_module(module))
    with pytest.raises(ValueError, match="upstream failed"):
        importlib.import_module("hooked_target")
    assert not module_hooked("hooked_target")


def test_run_with_lines_replaced_runs_upstream_unless_every_line_is_found_once(tmp_path):
    import importlib.util
    from types import ModuleType

    from bionemo.core.module_hook import run_with_lines_replaced

    path = tmp_path / "patched.py"
    module = ModuleType("patched")
    module.__spec__ = importlib.util.spec_from_file_location("patched", path)
    ran = []
    lines = {"A = 1\n": "A = 10\n", "B = 2\n": "B = 20\n"}
    for source in ("A = 1\nC = 3\n", "A = 1\nB = 2\nB = 2\n"):  # a line missing, a line twice
        path.write_text(source)
        assert run_with_lines_replaced(ran.append, module, lines) is False
    assert ran == [module, module]
    path.write_text("A = 1\nB = 2\nC = A + B\n")
    assert run_with_lines_replaced(ran.append, module, lines) is True
    assert (module.A, module.B, module.C, len(ran)) == (10, 20, 30, 2)
