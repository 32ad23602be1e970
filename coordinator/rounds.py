"""The run's round records, kept in the coordinator's database rather than in memory.

Every record an agent reports (checked first by :mod:`airgossip.coordinator.reports`) is one row of
the ``rounds`` table, keyed by agent and round: a round reported again (an agent restarted
from a checkpoint) replaces the first. The coordinator holds in memory only what it needs
at every report: per agent, how many rounds it holds and the latest; the records
themselves are read back when the results are written (:meth:`RoundStore.records`) or a
graph schedule asks for one round of every agent (:meth:`RoundStore.at_round`). However long
the run, the coordinator's memory does not grow with it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from airgossip.coordinator.database import Database, Row
from airgossip.edge.agent.rejoin import fleet_round
from airgossip.edge.observability.stats import RoundRecord


@dataclass(frozen=True)
class AgentRounds:
    """What the database holds of one agent's rounds."""

    held: int = 0
    latest: int | None = None


def _record(text: str, blob: bytes | None) -> RoundRecord:
    record = RoundRecord.from_json(json.loads(text))
    if blob is not None:
        record.estimate = np.frombuffer(blob, dtype="<f8").astype(np.float64)
    return record


class RoundStore:
    """Round records by agent and round, in ``database``'s ``rounds`` table (thread-safe)."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._agents: dict[str, AgentRounds] = {
            str(agent_id): AgentRounds(int(held), int(latest))
            for agent_id, held, latest in database.query(
                "SELECT agent_id, COUNT(*), MAX(round) FROM rounds GROUP BY agent_id"
            )
        }

    def add(self, agent_id: str, records: Sequence[RoundRecord]) -> AgentRounds:
        """Keep ``records`` of ``agent_id`` (a round held already is replaced); return what
        is held of the agent now. Raises :class:`~airgossip.coordinator.database.StoreError`."""
        rows = [
            (
                agent_id,
                r.round,
                json.dumps(r.to_json()),
                None if r.estimate is None else np.asarray(r.estimate, "<f8").tobytes(),
            )
            for r in records
        ]
        rounds = [r.round for r in records]
        with self._db.transaction() as db:
            known = {
                int(row[0])
                for row in db.execute(
                    "SELECT round FROM rounds WHERE agent_id = ? AND round IN "
                    f"({', '.join('?' * len(rounds))})",
                    (agent_id, *rounds),
                )
            }
            db.executemany("INSERT OR REPLACE INTO rounds VALUES (?, ?, ?, ?)", rows)
        before = self._agents.get(agent_id, AgentRounds())
        latest = max([*rounds, *([] if before.latest is None else [before.latest])], default=None)
        after = AgentRounds(before.held + len(set(rounds) - known), latest)
        self._agents[agent_id] = after
        return after

    def holds_any(self) -> bool:
        """Whether any round record is kept."""
        return any(r.held for r in self._agents.values())

    def of(self, agent_id: str) -> AgentRounds:
        """What is held of ``agent_id``'s rounds."""
        return self._agents.get(agent_id, AgentRounds())

    def quorum_latest(self) -> int:
        """The highest round that a quorum of the agents that reported have reached (their
        latest reports; :func:`~airgossip.edge.agent.rejoin.fleet_round`): at least two of them and
        a majority, so that one agent's reports cannot set it (0: fewer than two reported)."""
        latest = {a: r.latest for a, r in self._agents.items() if r.latest is not None}
        return fleet_round(latest) or 0

    def at_round(self, round_index: int) -> dict[str, RoundRecord]:
        """Every agent's record of ``round_index``, by agent (agents that did not report it
        are missing)."""
        rows = self._db.query(
            "SELECT agent_id, record, estimate FROM rounds WHERE round = ?", (round_index,)
        )
        return {str(row[0]): _record(row[1], row[2]) for row in rows}

    def latest(self) -> dict[str, RoundRecord]:
        """Every agent's latest record, without its estimate: what a launcher's progress
        needs, read as often as it polls (every record with its estimate is megabytes for a
        large fleet, and reading them holds the database)."""
        rows = self._db.query(
            "SELECT r.agent_id, r.record FROM rounds AS r JOIN "
            "(SELECT agent_id, MAX(round) AS last FROM rounds GROUP BY agent_id) AS l "
            "ON r.agent_id = l.agent_id AND r.round = l.last"
        )
        return {str(agent_id): _record(text, None) for agent_id, text in rows}

    def records(self) -> dict[str, list[RoundRecord]]:
        """Every agent's records in round order (read from the database: the results')."""
        out: dict[str, list[RoundRecord]] = {}
        rows: list[Row] = self._db.query(
            "SELECT agent_id, record, estimate FROM rounds ORDER BY agent_id, round"
        )
        for agent_id, text, blob in rows:
            out.setdefault(str(agent_id), []).append(_record(text, blob))
        return out
