"""Files and folders made private whatever the umask.

What :mod:`airgossip.common.security.private_files` promises.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from airgossip.common.security.private_files import open_private, private_folder, write_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture(params=[0o000, 0o022, 0o777])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The process's umask for the test: none, the usual, and one that takes every bit."""
    before = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(before)


def test_folders_are_private_with_their_parents(tmp_path: Path, umask: int) -> None:
    made = private_folder(tmp_path / "a" / "b" / "c")
    assert made.is_dir()
    for folder in (tmp_path / "a", tmp_path / "a" / "b", made):
        assert mode(folder) == 0o700, oct(umask)


def test_existing_folder_tightened_unless_told_not_to(tmp_path: Path) -> None:
    mine, theirs = tmp_path / "run", tmp_path / "etc-certs"
    for folder in (mine, theirs):
        folder.mkdir()
        os.chmod(folder, 0o777)
    private_folder(mine)
    private_folder(theirs, tighten=False)
    assert mode(mine) == 0o700
    assert mode(theirs) == 0o777  # the user's own choice (a group, say) is theirs to make


@pytest.mark.parametrize("how", ["w", "a", "x", "wb", "ab", "xb"])
def test_open_private_makes_0600(tmp_path: Path, umask: int, how: str) -> None:
    path = tmp_path / "file"
    with open_private(path, how) as handle:  # type: ignore[call-overload]
        handle.write(b"x" if "b" in how else "x")
    assert mode(path) == 0o600, oct(umask)
    assert path.read_bytes() == b"x"


def test_a_file_that_was_wider_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text("old\n")
    os.chmod(path, 0o666)
    with open_private(path, "a") as handle:
        handle.write("new\n")
    assert mode(path) == 0o600
    assert path.read_text() == "old\nnew\n"


def test_write_private_is_atomic_and_private(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "results.json"
    write_private(path, "{}\n")
    write_private(path, b"[]\n")
    assert path.read_text() == "[]\n"
    assert mode(path) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temporary left


def test_links_are_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    link = tmp_path / "estimates"
    link.symlink_to(target)
    with pytest.raises(OSError):
        open_private(link, "ab")
    write_private(link, "replaced")  # atomic: the link itself is replaced, not its target
    assert target.read_text() == "keep"
    assert not link.is_symlink() and mode(link) == 0o600


def test_bad_mode_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mode 'r'"):
        open_private(tmp_path / "f", "r")  # type: ignore[call-overload]
