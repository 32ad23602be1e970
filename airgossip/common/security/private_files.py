"""Files and folders only their owner may read, whatever the umask.

A run's folder holds what its agents learned (estimates, round records), its launch config
and its members' keys; a fleet's certificate folder holds its authority's key. Every writer
of them goes through here, so that a file is created 0600 and a folder 0700 by the call that
makes it (``os.open``'s mode, ``mkdir``'s mode): nothing is ever readable by others, not even
between a create and a ``chmod``. The umask can only take bits away from a mode, so a umask
of 000 leaves these modes as they are, and one that takes the owner's own bits (0777) is
undone at once on what was just made (still private to its owner).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO, Literal, overload

#: What a private file's mode is.
PRIVATE_FILE = 0o600
#: What a private folder's mode is.
PRIVATE_FOLDER = 0o700

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

TextMode = Literal["w", "a", "x"]
BinaryMode = Literal["wb", "ab", "xb"]

_FLAGS = {
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
}


def private_folder(path: Path, *, tighten: bool = True) -> Path:
    """``path`` made, with any missing parents, private (0700). ``tighten``: a ``path`` that
    was there already is made private too (a run's own folder); without it, a folder the
    user made keeps the mode they chose (a device's ``/etc/airgossip/certs``, 0750 for a
    group). Returns ``path``."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # a racing writer's: made private below
            folder.mkdir(mode=PRIVATE_FOLDER)
        os.chmod(folder, PRIVATE_FOLDER)  # a umask that took the owner's bits
    if not missing and tighten:
        os.chmod(path, PRIVATE_FOLDER)
    return path


def open_private_fd(path: Path, flags: int) -> int:
    """``os.open`` of ``path`` with ``flags`` (``O_CREAT`` among them), as a private file:
    made 0600 if new, made 0600 if it was there; never through a symbolic link."""
    fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC, PRIVATE_FILE)
    try:
        os.fchmod(fd, PRIVATE_FILE)  # one that was there before may have been wider
    except BaseException:
        os.close(fd)
        raise
    return fd


@overload
def open_private(path: Path, mode: TextMode = "w") -> IO[str]: ...
@overload
def open_private(path: Path, mode: BinaryMode) -> IO[bytes]: ...
def open_private(path: Path, mode: str = "w") -> IO[str] | IO[bytes]:
    """``open(path, mode)`` for writing (``w``, ``a``, ``x``, with or without ``b``) of a
    private file (see :func:`open_private_fd`); its folder must be there."""
    flags = _FLAGS.get(mode.replace("b", ""))
    if flags is None or mode not in ("w", "a", "x", "wb", "ab", "xb"):
        raise ValueError(f"mode {mode!r} is not one of w, a, x, wb, ab, xb")
    fd = open_private_fd(Path(path), flags)
    if "b" in mode:
        return os.fdopen(fd, mode)
    return open(fd, mode, encoding="utf-8")


def write_private(path: Path, data: bytes | str, *, atomic: bool = True) -> Path:
    """Write ``data`` to ``path`` as a private file; with ``atomic``, through a private
    temporary file beside it, so that a reader sees the old content or the new, never part.
    Returns ``path``."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if not atomic:
        with open_private(path, "wb") as handle:
            handle.write(raw)
        return path
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # A stale one (or a link planted there) is not written through.
    tmp.unlink(missing_ok=True)
    try:
        with open_private(tmp, "xb") as handle:
            handle.write(raw)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
