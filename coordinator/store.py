"""SQLite persistence of the coordinator: registrations, the graph and every assignment.

Every change of membership or topology is committed in one transaction before any agent
hears of it, so a coordinator killed at any moment and restarted on the same database hands
out exactly what it had handed out. Heartbeat figures are not stored: they are stale by the
time a coordinator comes back, and agents resend them within one heartbeat interval.

The database is in WAL mode, so tools (and tests) can read it while the coordinator runs.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge.observability.stats import RoundRecord
from edge.topology import Assignment, Phase

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS members (
    agent_id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    metrics_address TEXT NOT NULL,
    digest TEXT NOT NULL,
    state TEXT NOT NULL,
    joined_at REAL NOT NULL,
    changed_at REAL NOT NULL,
    incarnation INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS assignments (
    agent_id TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL,
    assignment TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rounds (
    agent_id TEXT NOT NULL,
    round INTEGER NOT NULL,
    record TEXT NOT NULL,
    estimate BLOB,
    PRIMARY KEY (agent_id, round)
);
"""


class StoreError(RuntimeError):
    """The database cannot be opened or holds a different fleet; the message says which."""


@dataclass
class MemberRecord:
    """One registration as stored.

    Attributes
    ----------
    state:
        ``alive``, ``dead`` (missed its heartbeats) or ``left`` (said goodbye).
    joined_at, changed_at:
        Wall-clock seconds of the first registration and of the last state change.
    incarnation:
        How many times the agent registered from a new process or address.
    """

    agent_id: str
    address: str
    metrics_address: str
    digest: str
    state: str
    joined_at: float
    changed_at: float
    incarnation: int = 1


@dataclass
class StoredFleet:
    """Everything a restarted coordinator needs."""

    topology: dict[str, Any]
    expected: int
    epoch: int
    graph: dict[str, Any] | None
    policy_state: dict[str, Any]
    members: dict[str, MemberRecord]
    assignments: dict[str, Assignment]
    #: The run's start (unix seconds; None before the fleet was complete).
    started_unix: float | None = None


def assignment_to_json(assignment: Assignment) -> str:
    return json.dumps(
        {
            "epoch": assignment.epoch,
            "peers": assignment.peers,
            "schedule": [
                {
                    "self_weight": p.self_weight,
                    "out_weights": p.out_weights,
                    "in_neighbours": list(p.in_neighbours),
                }
                for p in assignment.schedule
            ],
            "lambda2": None if math.isnan(assignment.lambda2) else assignment.lambda2,
        }
    )


def assignment_from_json(text: str) -> Assignment:
    data = json.loads(text)
    return Assignment(
        epoch=int(data["epoch"]),
        peers={str(k): str(v) for k, v in data["peers"].items()},
        schedule=tuple(
            Phase(
                float(p["self_weight"]),
                {str(k): float(v) for k, v in p["out_weights"].items()},
                tuple(p["in_neighbours"]),
            )
            for p in data["schedule"]
        ),
        lambda2=math.nan if data["lambda2"] is None else float(data["lambda2"]),
    )


class FleetStore:
    """The coordinator's database.

    Parameters
    ----------
    path:
        SQLite file (created if missing); ``None`` keeps everything in memory (a coordinator
        embedded in a launcher that lives as long as its fleet).

    Raises
    ------
    StoreError
        When the file cannot be opened or is not an airgossip coordinator database.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = str(path) if path is not None else ":memory:"
        self._lock = threading.Lock()
        try:
            if path is not None and not Path(path).parent.is_dir():
                raise sqlite3.OperationalError(f"folder {Path(path).parent} does not exist")
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            if path is not None:
                self._db.execute("PRAGMA journal_mode=WAL")
                # A committed change must survive the coordinator's death (kill -9).
                self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            version = self._meta("schema_version")
            if version is None:
                self._db.execute(
                    "INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
            elif int(version) != SCHEMA_VERSION:
                raise StoreError(
                    f"database {self.path} has schema version {version}; this coordinator "
                    f"reads version {SCHEMA_VERSION}"
                )
        except sqlite3.Error as err:
            raise StoreError(f"cannot use database {self.path}: {err}") from None

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def load(self) -> StoredFleet | None:
        """The stored fleet, or None for a new database."""
        with self._lock:
            topology = self._meta("topology")
            if topology is None:
                return None
            graph = self._meta("graph")
            members = {
                row[0]: MemberRecord(*row)
                for row in self._db.execute(
                    "SELECT agent_id, address, metrics_address, digest, state, joined_at, "
                    "changed_at, incarnation FROM members"
                )
            }
            assignments = {
                row[0]: assignment_from_json(row[1])
                for row in self._db.execute("SELECT agent_id, assignment FROM assignments")
            }
            return StoredFleet(
                topology=json.loads(topology),
                expected=int(self._meta("expected") or 0),
                epoch=int(self._meta("epoch") or 0),
                graph=json.loads(graph) if graph else None,
                policy_state=json.loads(self._meta("policy_state") or "{}"),
                members=members,
                assignments=assignments,
                started_unix=float(started) if (started := self._meta("started_unix")) else None,
            )

    def claim(self, topology: dict[str, Any], expected: int) -> StoredFleet | None:
        """Load the stored fleet after checking it runs ``topology`` for ``expected`` agents;
        record them in a new database.

        Raises
        ------
        StoreError
            When the database holds a fleet with another topology or size.
        """
        stored = self.load()
        if stored is None:
            with self._lock, self._db:
                self._db.execute("BEGIN")
                self._db.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('topology', ?)", (json.dumps(topology),)
                )
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('expected', ?)", (expected,))
            return None
        if stored.topology != topology or stored.expected != expected:
            raise StoreError(
                f"database {self.path} holds a fleet of {stored.expected} agents on topology "
                f"{json.dumps(stored.topology)}, not {expected} on {json.dumps(topology)}; "
                "start with the same settings or another --db"
            )
        return stored

    def commit(
        self,
        members: Iterable[MemberRecord],
        *,
        epoch: int | None = None,
        graph: dict[str, Any] | None = None,
        policy_state: dict[str, Any] | None = None,
        assignments: dict[str, Assignment] | None = None,
    ) -> None:
        """Write changed members and, with ``epoch``, the new graph and assignments, in one
        transaction."""
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR REPLACE INTO members VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (m.agent_id, m.address, m.metrics_address, m.digest, m.state,
                     m.joined_at, m.changed_at, m.incarnation)
                    for m in members
                ],
            )  # fmt: skip
            if epoch is None:
                return
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('epoch', ?)", (str(epoch),))
            self._db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('graph', ?)", (json.dumps(graph or {}),)
            )
            self._db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('policy_state', ?)",
                (json.dumps(policy_state or {}),),
            )
            self._db.execute("DELETE FROM assignments")
            self._db.executemany(
                "INSERT INTO assignments VALUES (?, ?, ?)",
                [(i, a.epoch, assignment_to_json(a)) for i, a in (assignments or {}).items()],
            )

    def stored_run(self) -> tuple[str, dict[str, Any]] | None:
        """The id and scenario of the run this database holds (None: a new database)."""
        with self._lock:
            run_id, scenario = self._meta("run_id"), self._meta("scenario")
        return None if run_id is None else (run_id, json.loads(scenario or "{}"))

    def claim_run(self, run_id: str, scenario: dict[str, Any]) -> str:
        """The id of the run this database holds (a new database records ``run_id`` and
        ``scenario``).

        Raises
        ------
        StoreError
            When the database holds a run of another scenario.
        """
        with self._lock, self._db:
            stored_id, stored_scenario = self._meta("run_id"), self._meta("scenario")
            if stored_id is None:
                self._db.execute("BEGIN")
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('run_id', ?)", (run_id,))
                self._db.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('scenario', ?)", (json.dumps(scenario),)
                )
                return run_id
        if json.loads(stored_scenario or "{}") != scenario:
            raise StoreError(
                f"database {self.path} holds run {stored_id} of another scenario; start with "
                "the same scenario or another --db"
            )
        return stored_id

    def mark_started(self, started_unix: float) -> None:
        """Record when the run started (the fleet was complete)."""
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('started_unix', ?)", (repr(started_unix),)
            )

    def add_rounds(self, agent_id: str, records: Iterable[RoundRecord]) -> None:
        """Keep ``agent_id``'s round records (a round stored again replaces the first)."""
        rows = [
            (
                agent_id,
                r.round,
                json.dumps(r.to_json()),
                None if r.estimate is None else np.asarray(r.estimate, "<f8").tobytes(),
            )
            for r in records
        ]
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO rounds VALUES (?, ?, ?, ?)", rows)

    def load_rounds(self) -> dict[str, list[RoundRecord]]:
        """Every agent's stored round records, in round order."""
        out: dict[str, list[RoundRecord]] = {}
        with self._lock:
            rows = self._db.execute(
                "SELECT agent_id, record, estimate FROM rounds ORDER BY agent_id, round"
            ).fetchall()
        for agent_id, text, blob in rows:
            record = RoundRecord.from_json(json.loads(text))
            if blob is not None:
                record.estimate = np.frombuffer(blob, dtype="<f8").astype(np.float64)
            out.setdefault(agent_id, []).append(record)
        return out

    def close(self) -> None:
        with self._lock:
            self._db.close()
