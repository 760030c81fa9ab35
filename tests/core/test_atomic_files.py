"""Files and folders renamed into place get the mode ``open``/``mkdir`` gives, and appear whole or not at all."""

import os
import stat
import tempfile

import pytest

from bionemo.core.atomic_files import give_default_permissions, replaced_atomically


@pytest.fixture
def umask_027():
    """Run the test under umask ``0o027``; the process's umask is put back afterwards."""
    previous = os.umask(0o027)
    yield 0o027
    os.umask(previous)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_temporary_files_and_folders_get_the_mode_open_and_mkdir_give(tmp_path, umask_027):
    (tmp_path / "plain").touch()
    (tmp_path / "plain_dir").mkdir()
    fd, file = tempfile.mkstemp(dir=tmp_path)
    os.close(fd)
    folder = tempfile.mkdtemp(dir=tmp_path)
    assert (_mode(file), _mode(folder)) == (0o600, 0o700)  # what tempfile gives, before
    give_default_permissions(file)
    give_default_permissions(folder)
    assert _mode(file) == _mode(tmp_path / "plain") == 0o640
    assert _mode(folder) == _mode(tmp_path / "plain_dir") == 0o750
    assert os.umask(0o027) == 0o027  # the umask is left as it was


def test_replaced_atomically_writes_the_whole_file_with_the_default_mode(tmp_path, umask_027):
    target = tmp_path / "deep" / "out.txt"
    with replaced_atomically(target) as tmp:
        tmp.write_text("new")
        assert not target.exists()
    assert target.read_text() == "new"
    assert _mode(target) == 0o640


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")

    def write_half() -> None:
        with replaced_atomically(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_half()
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
