"""Per-round records an agent emits, and sinks that keep them.

The agent knows nothing of Prometheus, files or launchers: it hands plain
:class:`RoundRecord` objects to a :class:`StatsSink`. A launcher reads them back to compute
fleet figures such as the consensus distance, which needs every agent's estimate.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Protocol, TypedDict

import numpy as np

from airgossip.common.security.private_files import open_private, private_folder

#: Estimates longer than this are reported as a count sketch (see :func:`probe_estimate`).
EXACT_ESTIMATE_LIMIT = 1 << 20
SKETCH_SIZE = 1 << 16


@dataclass
class Counters:
    """What an agent has sent and received since it started (cumulative).

    The one spelling of the counter vocabulary: the agent keeps one, every round record and
    heartbeat snapshot carries a copy, and the coordinator's messages and metrics are made
    from its fields.
    """

    bytes_sent: int = 0
    messages_sent: int = 0
    #: Lost on an emulated link.
    messages_dropped: int = 0
    #: Refused by the receiver, or failed in transport.
    messages_failed: int = 0
    messages_received: int = 0
    messages_rejected: int = 0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_fields(cls, source: object) -> Counters:
        """Read the counters from any object with attributes of the same names (a protobuf
        message, say)."""
        return cls(**{name: int(getattr(source, name)) for name in cls.names()})

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))

    def copy(self) -> Counters:
        return copy.copy(self)

    @property
    def messages_lost(self) -> int:
        """Sent messages that did not arrive: dropped by the link or failed."""
        return self.messages_dropped + self.messages_failed


class _RoundRecordFields(TypedDict):
    agent_id: str
    round: int
    wall_s: float


class RoundRecordJson(_RoundRecordFields, total=False):
    """A :class:`RoundRecord` as one JSON object (:meth:`RoundRecord.to_json` writes every
    key; a reader takes a record without the optional ones)."""

    metrics: dict[str, float]
    scalars: dict[str, float]
    final: bool
    # The counters, flat beside the other fields (the fields of :class:`Counters`).
    bytes_sent: int
    messages_sent: int
    messages_dropped: int
    messages_failed: int
    messages_received: int
    messages_rejected: int
    # Where a sink wrote the record's estimate (:class:`JsonlSink`: its index and length).
    estimate_index: int
    estimate_size: int


@dataclass
class RoundRecord:
    """One agent's state after one round (round 0: before the first)."""

    agent_id: str
    round: int
    wall_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)
    scalars: dict[str, float] = field(default_factory=dict)
    final: bool = False
    estimate: np.ndarray | None = field(default=None, repr=False)

    def to_json(self) -> RoundRecordJson:
        """A flat JSON object (the counters beside the other fields), without the estimate."""
        c = self.counters
        return {
            "agent_id": self.agent_id, "round": self.round, "wall_s": self.wall_s,
            "metrics": dict(self.metrics), "scalars": dict(self.scalars), "final": self.final,
            "bytes_sent": c.bytes_sent, "messages_sent": c.messages_sent,
            "messages_dropped": c.messages_dropped, "messages_failed": c.messages_failed,
            "messages_received": c.messages_received, "messages_rejected": c.messages_rejected,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> RoundRecord:
        """The inverse of :meth:`to_json` (the estimate is not in the JSON; keys a sink adds
        beside the record, such as where its estimate is, are left aside); ``KeyError`` or
        ``TypeError`` for a record without its id, round or time or with a value of the
        wrong type."""
        counters = Counters(**{name: _integer(data, name, 0) for name in Counters.names()})
        final = data.get("final", False)
        if not isinstance(data["agent_id"], str) or not isinstance(final, bool):
            raise TypeError("a round record's agent_id is not a string or final not a flag")
        return cls(
            agent_id=data["agent_id"], round=_integer(data, "round"),
            wall_s=_number(data["wall_s"], "wall_s"), metrics=_numbers(data, "metrics"),
            counters=counters, scalars=_numbers(data, "scalars"), final=final,
        )  # fmt: skip


def _number(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"a round record's {key} is not a number")
    return float(value)


def _integer(data: Mapping[str, object], key: str, default: int | None = None) -> int:
    value = data[key] if default is None else data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a round record's {key} is not an integer")
    return value


def _numbers(data: Mapping[str, object], key: str) -> dict[str, float]:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise TypeError(f"a round record's {key} is not a table")
    return {str(k): _number(v, f"{key}.{k}") for k, v in table.items()}


# Every counter has its key in the JSON of a round record (a counter added to one, not the
# other, is refused on import).
if set(Counters.names()) - set(RoundRecordJson.__optional_keys__):
    raise TypeError("RoundRecordJson lacks a key for a field of Counters")


class StatsSink(Protocol):
    def record(self, record: RoundRecord) -> None: ...


def probe_estimate(
    estimate: np.ndarray,
    seed: int = 0,
    *,
    limit: int = EXACT_ESTIMATE_LIMIT,
    buckets: int = SKETCH_SIZE,
) -> np.ndarray:
    """What the agent reports of its estimate for fleet-wide distances.

    Small models (at most ``limit`` elements): the estimate itself. Large ones: a count
    sketch of ``buckets`` buckets (the same hashing on every agent), which preserves
    distances in expectation at a fixed, small cost per round.
    """
    flat = np.asarray(estimate).reshape(-1)
    if flat.size <= limit:
        return flat
    rng = np.random.default_rng([seed, flat.size])
    index = rng.integers(0, buckets, flat.size)
    signs = rng.choice(np.array([-1.0, 1.0]), flat.size)
    return np.bincount(index, weights=signs * flat, minlength=buckets)


class MemoryStatsSink:
    """Keeps records in a list (in-process fleets and tests)."""

    def __init__(self) -> None:
        self.records: list[RoundRecord] = []
        self._lock = threading.Lock()

    def record(self, record: RoundRecord) -> None:
        with self._lock:
            self.records.append(record)


class FileStatsSink:
    """Appends records as JSON lines to ``<dir>/<agent>.jsonl``; estimates to ``<agent>.npy``-like
    raw file ``<agent>.estimates`` (float64, one vector per record that has one)."""

    def __init__(self, directory: Path, agent_id: str) -> None:
        private_folder(directory)  # what an agent learned is its owner's only
        self.json_path = directory / f"{agent_id}.jsonl"
        self.estimates_path = directory / f"{agent_id}.estimates"
        self._lock = threading.Lock()
        self._estimates = 0

    def record(self, record: RoundRecord) -> None:
        data = record.to_json()
        with self._lock:
            if record.estimate is not None:
                vector = np.ascontiguousarray(record.estimate, dtype=np.float64)
                with open_private(self.estimates_path, "ab") as handle:
                    handle.write(vector.tobytes())
                data["estimate_index"] = self._estimates
                data["estimate_size"] = int(vector.size)
                self._estimates += 1
            with open_private(self.json_path, "a") as handle:
                handle.write(json.dumps(data) + "\n")


def read_records(directory: Path, agent_id: str) -> list[RoundRecord]:
    """Read back what a :class:`FileStatsSink` wrote (a torn last line is skipped)."""
    json_path = directory / f"{agent_id}.jsonl"
    if not json_path.exists():
        return []
    estimates_path = directory / f"{agent_id}.estimates"
    raw = np.fromfile(estimates_path, dtype=np.float64) if estimates_path.exists() else None
    records = []
    for line in json_path.read_text().splitlines():
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        index, size = data.pop("estimate_index", None), data.pop("estimate_size", None)
        record = RoundRecord.from_json(data)
        if raw is not None and index is not None and size is not None:
            chunk = raw[index * size : (index + 1) * size]
            record.estimate = chunk if chunk.size == size else None
        records.append(record)
    return records
