"""The coordinator's SQLite file: opened private, checked intact, every failure one line.

:class:`Database` is the one connection the fleet's tables (:mod:`airgossip.coordinator.store`) and
the run's round records (:mod:`airgossip.coordinator.rounds`) share. It is opened so that:

* the file (and SQLite's ``-wal`` and ``-shm`` beside it) is readable by its owner only
  (0600), in a folder others cannot write; a folder it creates is 0700;
* a damaged file is found at once (``PRAGMA quick_check``) and refused in one line that says
  what to do, rather than failing half-way through a restore;
* any SQLite error later (a full disk, a file damaged while the coordinator runs) is a
  :class:`StoreError` with a one-line reason, never a ``sqlite3`` traceback.

Without a path the database is SQLite's own private temporary file (unlinked as soon as it
is opened): round records then live on disk, not in memory, however long the run.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger("airgossip.coordinator")

#: What a row of a query holds (SQLite's values are typed per value, not per column).
Row = tuple[Any, ...]
#: Parameters of a statement.
Params = Sequence[object]


class StoreError(RuntimeError):
    """The database cannot be opened, is damaged, or holds a different fleet; the message says
    which, in one line."""


def _private_folder(folder: Path) -> None:
    """Create ``folder`` (0700) if missing; refuse one that other users may write to."""
    if not folder.exists():
        try:
            folder.mkdir(mode=0o700, parents=True)
        except OSError as err:
            raise StoreError(f"cannot create folder {folder}: {err.strerror}") from None
        return
    if not folder.is_dir():
        raise StoreError(f"{folder} is not a folder")
    mode = stat.S_IMODE(folder.stat().st_mode)
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise StoreError(
            f"folder {folder} is writable by every user (mode {mode:04o}): another user could "
            "replace the database's journal; keep the database in a folder of mode 0700"
        )
    if mode & 0o077:
        log.warning(
            "the database folder %s is open to other users (mode %04o): the database itself "
            "is 0600, and a folder of mode 0700 keeps its journal's names private too",
            folder, mode,
        )  # fmt: skip


def _private_file(path: Path) -> None:
    """Create ``path`` readable by its owner only, or take an existing one down to 0600."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as err:
        raise StoreError(f"cannot use database {path}: {err.strerror}") from None
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class Database:
    """One SQLite connection, used from any thread under one lock.

    Parameters
    ----------
    path:
        The file (created if missing); ``None``: a private temporary file, gone at close.
    schema:
        ``CREATE ... IF NOT EXISTS`` statements run at open.

    Raises
    ------
    StoreError
        The file cannot be created or opened, is not a database, or is damaged.
    """

    def __init__(self, path: str | Path | None, schema: str) -> None:
        self.path = str(path) if path is not None else "(temporary)"
        self.lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        try:
            if path is None:
                # SQLite's own private temporary database: a file it unlinks as soon as it
                # opens it (nothing is left behind, even by a process killed with -9), with
                # only its page cache in memory.
                db = sqlite3.connect("", check_same_thread=False, isolation_level=None)
            else:
                file = Path(path)
                _private_folder(file.parent)
                _private_file(file)
                for suffix in ("-wal", "-shm"):  # SQLite gives them the database's own mode
                    sidecar = Path(f"{file}{suffix}")
                    if sidecar.exists():
                        os.chmod(sidecar, 0o600)
                db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except (sqlite3.Error, OSError) as err:
            raise StoreError(f"cannot use database {self.path}: {err}") from None
        self._db = db
        try:
            db.execute("PRAGMA journal_mode=WAL")
            # A committed change must survive the coordinator's death (kill -9); a temporary
            # database dies with the coordinator anyway.
            db.execute(f"PRAGMA synchronous={'OFF' if path is None else 'FULL'}")
            self._check_intact(db)
            db.executescript(schema)
        except sqlite3.Error as err:
            self.close()
            if type(err) is sqlite3.DatabaseError:  # not a database, or a malformed one
                raise self._damaged(str(err)) from None
            raise StoreError(f"cannot use database {self.path}: {err}") from None
        except StoreError:
            self.close()
            raise

    def _check_intact(self, db: sqlite3.Connection) -> None:
        problems = [str(row[0]) for row in db.execute("PRAGMA quick_check(3)")]
        if problems != ["ok"]:
            raise self._damaged(" ".join(problems).replace("*** in database main ***", ""))

    def _damaged(self, detail: str) -> StoreError:
        return StoreError(
            f"database {self.path} is damaged ({' '.join(detail.split())[:120]}): restore it "
            "from a backup, or start with another --db (the agents register again; what this "
            "one held is lost)"
        )

    def _failed(self, err: sqlite3.Error) -> StoreError:
        return StoreError(f"database {self.path} failed: {err}")

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError(f"database {self.path} is closed")
        return self._db

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection inside one transaction: committed when the block ends, rolled back
        if it raises. Raises :class:`StoreError` for any SQLite error."""
        with self.lock:
            db = self._open()
            try:
                db.execute("BEGIN")
                try:
                    yield db
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
            except sqlite3.Error as err:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise self._failed(err) from None

    def query(self, sql: str, params: Params = ()) -> list[Row]:
        """Every row of one query (:class:`StoreError` for any SQLite error)."""
        with self.lock:
            db = self._open()
            try:
                return [tuple(row) for row in db.execute(sql, params)]
            except sqlite3.Error as err:
                raise self._failed(err) from None

    def close(self) -> None:
        """Close the connection (a temporary database is gone with it)."""
        with self.lock:
            if self._db is not None:
                self._db.close()
                self._db = None
