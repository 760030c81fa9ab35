"""Triton's compiler key from a file: the same key as Triton's, read back while Triton's files are unchanged."""

import os

import pytest

triton = pytest.importorskip("triton")

from bionemo.layers import _triton_key  # noqa: E402
from bionemo.layers._triton_key import KEY_CACHE_SWITCH, key_file, remember_compiler_key  # noqa: E402


@pytest.fixture
def namespace(monkeypatch, tmp_path):
    """Triton's ``triton_key`` namespace, restored after the test; Triton's cache folder under ``tmp_path``."""
    globals_ = _triton_key._key_namespace()
    assert globals_ is not None, "this Triton builds kernel cache keys without a module-level triton_key"
    monkeypatch.setitem(globals_, "triton_key", globals_["triton_key"])
    monkeypatch.setattr(_triton_key, "_cache_folder", lambda: tmp_path / "cache")
    monkeypatch.delenv(KEY_CACHE_SWITCH, raising=False)
    remember_compiler_key.cache_clear()
    yield globals_
    remember_compiler_key.cache_clear()


def test_the_key_is_tritons_then_read_from_its_file(namespace):
    original = namespace["triton_key"]
    assert remember_compiler_key()
    path = key_file()
    assert path is not None
    assert not path.exists()
    key = namespace["triton_key"]()
    assert key == original()
    assert path.read_text() == key
    assert namespace["triton_key"]() is key  # remembered in the process as well
    # a later process reads the file instead of hashing Triton's files
    path.write_text("key from the file")
    remember_compiler_key.cache_clear()
    namespace["triton_key"] = original
    assert remember_compiler_key()
    assert namespace["triton_key"]() == "key from the file"
    assert namespace["get_cache_key"].__globals__["triton_key"] is namespace["triton_key"]


def test_switched_off_leaves_triton_as_it_is(namespace, monkeypatch):
    original = namespace["triton_key"]
    monkeypatch.setenv(KEY_CACHE_SWITCH, "0")
    assert not remember_compiler_key()
    assert namespace["triton_key"] is original


def test_an_unwritable_cache_still_gives_the_key(namespace, monkeypatch, tmp_path):
    original = namespace["triton_key"]
    (tmp_path / "cache").write_text("a file where the folder would be")
    assert remember_compiler_key()
    assert namespace["triton_key"]() == original()


def test_the_file_name_changes_with_any_hashed_file(tmp_path, monkeypatch):
    monkeypatch.setattr(_triton_key, "_cache_folder", lambda: tmp_path / "cache")
    root = tmp_path / "triton"
    (root / "_C").mkdir(parents=True)
    assert key_file(root) is None  # no libtriton: nothing to key on
    library = root / "_C" / "libtriton.so"
    library.write_bytes(b"library")
    source = root / "language" / "core.py"
    source.parent.mkdir()
    source.write_text("x = 1\n")
    names = {key_file(root)}
    assert key_file(root) in names  # the same files, the same name
    os.utime(source, ns=(0, 10**9))
    names.add(key_file(root))
    source.write_text("x = 22\n")  # another size
    names.add(key_file(root))
    os.utime(library, ns=(0, 2 * 10**9))
    names.add(key_file(root))
    (root / "compiler").mkdir()
    (root / "compiler" / "code_generator.py").write_text("")  # a new file
    names.add(key_file(root))
    assert len(names) == 5
    assert all(name is not None and name.parent == tmp_path / "cache" / "bionemo-triton-key" for name in names)
