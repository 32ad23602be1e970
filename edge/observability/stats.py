"""Per-round records an agent emits, and sinks that keep them.

The agent knows nothing of Prometheus, files or launchers: it hands plain
:class:`RoundRecord` objects to a :class:`StatsSink`. A launcher reads them back to compute
fleet figures such as the consensus distance, which needs every agent's estimate.
"""

from __future__ import annotations

import copy
import json
import threading
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from airgossip.edge.security.private_files import open_private, private_folder

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

    def to_json(self) -> dict[str, Any]:
        """A flat JSON object (the counters beside the other fields), without the estimate."""
        data = asdict(self)
        data.pop("estimate")
        data.update(data.pop("counters"))
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RoundRecord:
        """The inverse of :meth:`to_json` (the estimate is not in the JSON; keys a sink adds
        beside the record, such as where its estimate is, are left aside)."""
        counters = Counters(**{name: int(data.get(name, 0)) for name in Counters.names()})
        known = {f.name for f in fields(cls)} - {"counters", "estimate"}
        return cls(**{k: v for k, v in data.items() if k in known}, counters=counters)


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
