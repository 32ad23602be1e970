"""When an agent writes its checkpoints, what one holds, and taking one up again.

The file format (atomic, checksummed, falling back to the previous file) is
:mod:`edge.agent.checkpoints`; what an agent keeps is an :class:`AgentState`, and a
:class:`Checkpointer` writes one every interval, one writer at a time, and loads the newest
that belongs to the agent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edge.agent.checkpoints import CheckpointError, CheckpointStore
from edge.observability.stats import Counters

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentState:
    """Everything a restarted agent needs.

    Attributes
    ----------
    agent_id, digest:
        Whose state it is: an agent refuses another agent's or another task's.
    round:
        The last round the agent ran.
    counters:
        What it had sent and received.
    model:
        The de-biased estimate (float32; for tools that read a checkpoint).
    algorithm:
        The algorithm's own state (``GossipAlgorithm.state_dict``; no per-edge state).
    incarnation:
        The incarnation that wrote it: a restarted agent takes a larger one
        (:func:`~edge.agent.lineage.new_incarnation`).
    """

    agent_id: str
    digest: str
    round: int
    counters: Counters
    model: torch.Tensor
    algorithm: dict[str, Any]
    incarnation: int = 0

    def to_checkpoint(self) -> dict[str, object]:
        return {
            "agent_id": self.agent_id,
            "digest": self.digest,
            "round": self.round,
            "counters": self.counters.as_dict(),
            "model": self.model,
            "algorithm": self.algorithm,
            "incarnation": self.incarnation,
        }

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any]) -> AgentState:
        """The state a checkpoint file holds; ``KeyError``/``TypeError``/``ValueError`` when
        it lacks a part or a part has the wrong type."""
        model, algorithm = state["model"], state["algorithm"]
        if not isinstance(model, torch.Tensor) or not isinstance(algorithm, dict):
            raise TypeError("model or algorithm state of the wrong type")
        return cls(
            agent_id=str(state["agent_id"]),
            digest=str(state["digest"]),
            round=int(state["round"]),
            counters=Counters(**state["counters"]),
            model=model,
            algorithm=algorithm,
            incarnation=int(state.get("incarnation", 0)),
        )


class Checkpointer:
    """Writes an agent's checkpoints every ``interval_s`` into ``store`` and loads the newest.

    ``write`` may be called from the round loop and from a send path at once: writes are
    serialised in the order their states were taken.
    """

    def __init__(
        self,
        store: CheckpointStore,
        *,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last = clock()

    def due(self) -> bool:
        """Whether ``interval_s`` has passed since the last write."""
        return self._clock() - self._last >= self.interval_s

    def write(self, state: AgentState) -> None:
        with self._lock:  # one writer at a time, in the order states were taken
            self.store.save(state.to_checkpoint())
            self._last = self._clock()

    def load(self, agent_id: str, digest: str) -> tuple[AgentState, Path] | None:
        """The newest intact checkpoint of this agent and its file (None: it has none).

        A corrupt newer checkpoint is reported (a warning naming it and why) and the one
        before it used.

        Raises
        ------
        CheckpointError
            No checkpoint is intact, the newest is another agent's or task's, or it lacks
            what an agent needs.
        """
        loaded = self.store.load_latest()
        if loaded is None:
            return None
        for line in loaded.skipped:
            log.warning("%s: %s; resuming from %s instead", agent_id, line, loaded.path.name)
        raw = loaded.state
        if raw.get("agent_id") != agent_id or raw.get("digest") != digest:
            raise CheckpointError(
                f"checkpoint {loaded.path} belongs to {raw.get('agent_id')!r} with task digest "
                f"{raw.get('digest')!r}, not to {agent_id!r} with {digest!r}; "
                "point --checkpoint-dir elsewhere"
            )
        try:
            state = AgentState.from_checkpoint(raw)
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"checkpoint {loaded.path} cannot be resumed: {err}") from None
        return state, loaded.path
