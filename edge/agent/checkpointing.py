"""When an agent writes its checkpoints, what one holds, and taking one up again.

The file format (atomic, bound to its fleet, run and agent, MACed, falling back to the
previous file) is :mod:`airgossip.edge.agent.checkpoints`; what an agent keeps is an
:class:`AgentState`, and a :class:`Checkpointer` writes one every interval, one writer at a
time, and loads the newest that belongs to the agent and holds values it may hold.

The values are checked with the functions that hold incoming messages to the state bounds
(:func:`~airgossip.edge.algorithms.base.check_absorption`,
:func:`~airgossip.edge.algorithms.base.check_weight`,
:func:`~airgossip.edge.agent.admission.all_finite`): a checkpoint can leave an agent in no state
that a message could not, and a refused one leaves it as it was.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from airgossip.edge.agent.admission import MAX_ROUND, all_finite
from airgossip.edge.agent.checkpoints import CheckpointError, CheckpointState, CheckpointStore
from airgossip.edge.algorithms import GossipAlgorithm, InvalidPayload
from airgossip.edge.algorithms.base import check_absorption, check_weight
from airgossip.edge.algorithms.push_sum import PushSumCore
from airgossip.edge.algorithms.state import AlgorithmState, StateValue, state_int, state_table
from airgossip.edge.observability.stats import Counters

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
        (:func:`~airgossip.edge.agent.lineage.new_incarnation`).
    """

    agent_id: str
    digest: str
    round: int
    counters: Counters
    model: torch.Tensor
    algorithm: AlgorithmState
    incarnation: int = 0

    def to_checkpoint(self) -> CheckpointState:
        counters: dict[str, StateValue] = dict(self.counters.as_dict())
        return {
            "agent_id": self.agent_id,
            "digest": self.digest,
            "round": self.round,
            "counters": counters,
            "model": self.model,
            "algorithm": self.algorithm,
            "incarnation": self.incarnation,
        }

    @classmethod
    def from_checkpoint(cls, state: CheckpointState) -> AgentState:
        """The state a checkpoint file holds; ``KeyError``/``TypeError``/``ValueError`` when
        it lacks a part or a part has the wrong type."""
        model, algorithm = state["model"], state["algorithm"]
        if not isinstance(model, torch.Tensor) or not isinstance(algorithm, dict):
            raise TypeError("model or algorithm state of the wrong type")
        counters = state_table(state, "counters")
        return cls(
            agent_id=str(state["agent_id"]),
            digest=str(state["digest"]),
            round=state_int(state, "round"),
            counters=Counters(**{k: state_int(counters, k) for k in counters}),
            model=model,
            algorithm=algorithm,
            incarnation=state_int(state, "incarnation") if "incarnation" in state else 0,
        )


#: How a checkpoint is named in the messages of the wire's checks.
_SOURCE = "the checkpoint"


def check_values(state: AgentState, rounds: int) -> None:
    """:class:`CheckpointError` unless ``state`` holds only values an agent of a run of
    ``rounds`` rounds may hold: every float finite (tensors and numbers, at any depth), the
    model within the bounds of an incoming model, round, counters and incarnation in range.
    Checked before anything is loaded."""
    bad = _non_finite(state.algorithm, "algorithm")
    if bad is None and not all_finite(state.model.detach().to(torch.float64).reshape(-1)):
        bad = "model"
    if bad is not None:
        raise CheckpointError(f"{bad} holds NaN or infinite values")
    if not 0 <= state.round <= min(rounds, MAX_ROUND):
        raise CheckpointError(f"round {state.round} is outside this run's 0..{rounds}")
    negative = [f.name for f in fields(Counters) if getattr(state.counters, f.name) < 0]
    if negative or state.incarnation < 0:
        raise CheckpointError(f"negative {', '.join(negative) or 'incarnation'}")
    try:
        check_absorption(state.model.to(torch.float64), 1.0, _SOURCE)
    except InvalidPayload as err:
        raise CheckpointError(f"out of the bounds messages are held to: {err}") from None


def check_loaded(algorithm: GossipAlgorithm, before: AlgorithmState) -> None:
    """:class:`CheckpointError` unless the gossip state ``algorithm`` holds (just loaded from
    a checkpoint; ``before``: its ``state_dict`` as built) is one a message could leave it
    in: every tensor of the shape it was built with, a push-sum weight in
    ``(0, MAX_WEIGHT]``, its mass and its estimate within the bounds of
    :func:`~airgossip.edge.algorithms.base.check_absorption`."""
    after = algorithm.state_dict()
    for name, built in before.items():
        loaded = after.get(name)
        if isinstance(built, torch.Tensor) and (
            not isinstance(loaded, torch.Tensor) or loaded.shape != built.shape
        ):
            raise CheckpointError(
                f"algorithm.{name} has shape {tuple(getattr(loaded, 'shape', ()))}, "
                f"this agent's {tuple(built.shape)}"
            )
    try:
        if isinstance(algorithm, PushSumCore):
            check_weight("y", _SOURCE, algorithm.y, positive=True)
            check_absorption(algorithm.x, algorithm.y, _SOURCE)
            check_absorption(*algorithm.mass(), _SOURCE)  # with what it holds unmixed
        check_absorption(algorithm.estimate(), 1.0, _SOURCE)
    except InvalidPayload as err:
        raise CheckpointError(f"out of the bounds messages are held to: {err}") from None


def _non_finite(node: object, where: str) -> str | None:
    """Where in ``node`` (nested dicts and lists) a float is not finite (None: nowhere)."""
    if isinstance(node, torch.Tensor):
        if node.is_floating_point() and not all_finite(node.detach().to(torch.float64).reshape(-1)):
            return where
        return None
    if isinstance(node, float):
        return None if math.isfinite(node) else where
    if isinstance(node, dict):
        items: Any = node.items()
    elif isinstance(node, list | tuple):
        items = enumerate(node)
    else:
        return None
    for key, value in items:
        found = _non_finite(value, f"{where}.{key}")
        if found is not None:
            return found
    return None


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

    def load(
        self, digest: str, take: Callable[[AgentState, Path], None]
    ) -> tuple[AgentState, Path] | None:
        """Take up the newest checkpoint of this fleet, run and agent that holds ``digest``'s
        task and that ``take`` accepts (it raises :class:`CheckpointError` saying why not,
        leaving the agent as it was); return it and its file (None: none was usable).

        Every newer checkpoint is refused with one warning naming its file and why (corrupt,
        altered, another run's, agent's or task's, values out of range); with none usable the
        agent starts fresh, and a line says so.
        """
        agent_id = self.store.agent_id
        taken: list[AgentState] = []

        def accept(raw: CheckpointState, path: Path) -> None:
            if raw.get("digest") != digest:
                raise CheckpointError(
                    f"it is of another task or initial parameters (digest "
                    f"{str(raw.get('digest'))[:64]!r}, this agent's {digest!r})"
                )
            try:
                state = AgentState.from_checkpoint(raw)
            except (KeyError, TypeError, ValueError, AttributeError) as err:
                raise CheckpointError(f"it lacks what an agent resumes from ({err})") from None
            take(state, path)
            taken.append(state)

        loaded = self.store.load_latest(accept)
        for line in loaded.refused:
            log.warning("%s: %s", agent_id, line)
        if loaded.path is None:
            if loaded.refused:
                owner = self.store.owner
                log.warning(
                    "%s: no checkpoint in %s is usable for run %r; starting fresh",
                    agent_id, self.store.directory, owner.run,
                )  # fmt: skip
            return None
        return taken[-1], loaded.path
