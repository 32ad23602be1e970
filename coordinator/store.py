"""SQLite persistence of the coordinator: registrations, the graph and every assignment.

Every change of membership or topology is committed in one transaction before any agent
hears of it, so a coordinator killed at any moment and restarted on the same database hands
out exactly what it had handed out. Heartbeat figures are not stored: they are stale by the
time a coordinator comes back, and agents resend them within one heartbeat interval. The
run's round records share the file (:mod:`airgossip.coordinator.rounds`).

The database is in WAL mode, so tools (and tests) can read it while the coordinator runs;
how it is opened (private, checked intact) is :mod:`airgossip.coordinator.database`'s.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from airgossip.common.topology import Assignment, Phase
from airgossip.coordinator.database import Database, StoreError
from airgossip.coordinator.graphs import FleetGraphJson
from airgossip.coordinator.policy import PolicyState, TopologyDescription
from airgossip.coordinator.run import JsonObject

__all__ = ["FleetStore", "MemberRecord", "StoreError", "StoredFleet"]

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
CREATE INDEX IF NOT EXISTS rounds_by_round ON rounds (round);
"""


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

    topology: TopologyDescription
    expected: int
    epoch: int
    graph: FleetGraphJson | None
    policy_state: PolicyState
    members: dict[str, MemberRecord]
    assignments: dict[str, Assignment]
    #: The run's start (unix seconds; None before the fleet was complete).
    started_unix: float | None = None
    #: Elements of every estimate the run's reports carry (None: no agent registered yet).
    estimate_length: int | None = None


def assignment_to_json(assignment: Assignment) -> str:
    """An assignment as stored."""
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
    """The assignment :func:`assignment_to_json` stored."""
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
        SQLite file (created 0600 if missing); ``None``: a private temporary file, gone at
        :meth:`close` (a coordinator embedded in a launcher that lives as long as its fleet).

    Raises
    ------
    StoreError
        When the file cannot be opened, is damaged or is not an airgossip coordinator database.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.database = Database(path, _SCHEMA)
        self.path = self.database.path
        version = self._meta("schema_version")
        try:
            if version is None:
                self._set_meta(schema_version=str(SCHEMA_VERSION))
            elif int(version) != SCHEMA_VERSION:
                raise StoreError(
                    f"database {self.path} has schema version {version}; this coordinator "
                    f"reads version {SCHEMA_VERSION}"
                )
        except (StoreError, ValueError) as err:
            self.database.close()
            if isinstance(err, StoreError):
                raise
            raise StoreError(f"database {self.path} has schema version {version!r}") from None

    def _meta(self, key: str) -> str | None:
        rows = self.database.query("SELECT value FROM meta WHERE key = ?", (key,))
        return None if not rows else str(rows[0][0])

    def _set_meta(self, **values: str) -> None:
        with self.database.transaction() as db:
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(values.items()))

    def load(self) -> StoredFleet | None:
        """The stored fleet, or None for a new database (:class:`StoreError` for a file
        whose contents do not read back)."""
        try:
            return self._load()
        except (ValueError, TypeError, KeyError) as err:
            raise StoreError(
                f"database {self.path} holds a fleet that does not read back ({err!s:.120}): "
                "start with another --db"
            ) from None

    def _load(self) -> StoredFleet | None:
        topology = self._meta("topology")
        if topology is None:
            return None
        graph = self._meta("graph")
        members = {
            str(row[0]): MemberRecord(*row)
            for row in self.database.query(
                "SELECT agent_id, address, metrics_address, digest, state, joined_at, "
                "changed_at, incarnation FROM members"
            )
        }
        assignments = {
            str(row[0]): assignment_from_json(str(row[1]))
            for row in self.database.query("SELECT agent_id, assignment FROM assignments")
        }
        started = self._meta("started_unix")
        length = self._meta("estimate_length")
        return StoredFleet(
            topology=json.loads(topology),
            expected=int(self._meta("expected") or 0),
            epoch=int(self._meta("epoch") or 0),
            graph=json.loads(graph) if graph else None,
            policy_state=json.loads(self._meta("policy_state") or "{}"),
            members=members,
            assignments=assignments,
            started_unix=float(started) if started else None,
            estimate_length=int(length) if length is not None else None,
        )

    def claim(self, topology: TopologyDescription, expected: int) -> StoredFleet | None:
        """Load the stored fleet after checking it runs ``topology`` for ``expected`` agents;
        record them in a new database.

        Raises
        ------
        StoreError
            When the database holds a fleet with another topology or size.
        """
        stored = self.load()
        if stored is None:
            self._set_meta(topology=json.dumps(topology), expected=str(expected))
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
        graph: FleetGraphJson | None = None,
        policy_state: PolicyState | None = None,
        assignments: dict[str, Assignment] | None = None,
    ) -> None:
        """Write changed members and, with ``epoch``, the new graph and assignments, in one
        transaction."""
        with self.database.transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO members VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (m.agent_id, m.address, m.metrics_address, m.digest, m.state,
                     m.joined_at, m.changed_at, m.incarnation)
                    for m in members
                ],
            )  # fmt: skip
            if epoch is None:
                return
            db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [
                    ("epoch", str(epoch)),
                    ("graph", json.dumps(graph or {})),
                    ("policy_state", json.dumps(policy_state or {})),
                ],
            )
            db.execute("DELETE FROM assignments")
            db.executemany(
                "INSERT INTO assignments VALUES (?, ?, ?)",
                [(i, a.epoch, assignment_to_json(a)) for i, a in (assignments or {}).items()],
            )

    def stored_run(self) -> tuple[str, JsonObject] | None:
        """The id and scenario of the run this database holds (None: a new database)."""
        run_id, scenario = self._meta("run_id"), self._meta("scenario")
        return None if run_id is None else (run_id, json.loads(scenario or "{}"))

    def claim_run(self, run_id: str, scenario: JsonObject) -> str:
        """The id of the run this database holds (a new database records ``run_id`` and
        ``scenario``).

        Raises
        ------
        StoreError
            When the database holds a run of another scenario.
        """
        with self.database.transaction() as db:
            rows = db.execute(
                "SELECT key, value FROM meta WHERE key IN ('run_id', 'scenario')"
            ).fetchall()
            stored = {str(k): str(v) for k, v in rows}
            if "run_id" not in stored:
                db.executemany(
                    "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                    [("run_id", run_id), ("scenario", json.dumps(scenario))],
                )
                return run_id
        if json.loads(stored.get("scenario") or "{}") != scenario:
            raise StoreError(
                f"database {self.path} holds run {stored['run_id']} of another scenario; start "
                "with the same scenario or another --db"
            )
        return stored["run_id"]

    def mark_started(self, started_unix: float) -> None:
        """Record when the run started (the fleet was complete)."""
        self._set_meta(started_unix=repr(started_unix))

    def fix_estimate_length(self, length: int) -> None:
        """Record the elements of every estimate the run's reports carry."""
        self._set_meta(estimate_length=str(length))

    def close(self) -> None:
        """Close the database (a temporary one is removed)."""
        self.database.close()
