"""A folder written whole by ``write_folder`` gets the mode ``mkdir`` gives, new or replacing an old one."""

import os
import stat

from bionemo.esm2.hf.files import write_folder


def test_the_folder_gets_the_mode_mkdir_gives(tmp_path):
    previous = os.umask(0o027)
    try:
        (tmp_path / "plain").mkdir()
        new = write_folder(tmp_path / "new", lambda tmp: (tmp / "a.txt").write_text("a"))
        (tmp_path / "old").mkdir(mode=0o700)
        (tmp_path / "old" / "stale.txt").write_text("stale")
        replaced = write_folder(tmp_path / "old", lambda tmp: (tmp / "b.txt").write_text("b"), force=True)
    finally:
        os.umask(previous)
    for folder in (new, replaced):
        assert stat.S_IMODE(folder.stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o750
    assert [p.name for p in replaced.iterdir()] == ["b.txt"]
