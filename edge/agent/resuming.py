"""Checkpoints of a running agent: it writes its state, and after a crash takes up the newest
usable checkpoint as a new incarnation that starts every edge over
(:mod:`airgossip.edge.agent.lineage`)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import torch

from airgossip.edge.agent.checkpointing import AgentState, Checkpointer, check_loaded, check_values
from airgossip.edge.agent.checkpoints import CheckpointError
from airgossip.edge.agent.lineage import EdgeLineages, new_incarnation
from airgossip.edge.algorithms import GossipAlgorithm
from airgossip.edge.observability.stats import Counters
from airgossip.edge.settings import AgentSettings

# The agent's logger: these lines are the agent's, whichever module holds the code.
log = logging.getLogger("airgossip.edge.agent.agent")

#: What loading a checkpoint's gossip state raises when the state is refused
#: (:class:`CheckpointError`, a ValueError) or has parts missing or of the wrong kind.
_UNRESUMABLE = (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError)


class CheckpointSide:
    """The checkpoint methods of :class:`~airgossip.edge.agent.agent.Agent`. The state they
    share with the rest of the agent is declared here and set by ``Agent.__init__``."""

    agent_id: str
    digest: str
    round: int
    holds_past: bool
    settings: AgentSettings
    algorithm: GossipAlgorithm
    lineages: EdgeLineages
    checkpointer: Checkpointer | None
    _lock: threading.RLock
    _counters: Counters

    def _state(self) -> AgentState:
        """Everything a restarted agent needs (call under the lock)."""
        return AgentState(
            agent_id=self.agent_id,
            digest=self.digest,
            round=self.round,
            counters=self._counters.copy(),
            model=self.algorithm.estimate().to(torch.float32),
            algorithm=self.algorithm.state_dict(),
            incarnation=self.lineages.incarnation,
        )

    def checkpoint(self) -> None:
        """Write a checkpoint now (atomically; see :mod:`airgossip.edge.agent.checkpoints`)."""
        if self.checkpointer is None:
            raise RuntimeError("this agent keeps no checkpoints")
        with self._lock:
            state = self._state()
        self.checkpointer.write(state)

    def resume(self) -> int | None:
        """Take up the newest usable checkpoint (however old), if any, as a new incarnation
        that starts every edge over; return its round (None: none, the agent starts fresh).

        Usable: intact, MACed under this agent's key, of this fleet, run, agent and task,
        and holding values a message could have left it with
        (:func:`~airgossip.edge.agent.checkpointing.check_values`, ``check_loaded``). Every newer
        checkpoint is refused with one warning naming its file and why, and the one before
        it tried; with none usable the agent starts fresh.
        """
        if self.checkpointer is None:
            return None
        loaded = self.checkpointer.load(self.digest, self._take_up)
        if loaded is None:
            return None
        _, path = loaded
        log.info("%s: resumed round %d from %s", self.agent_id, self.round, path)
        return self.round

    def _take_up(self, state: AgentState, path: Path) -> None:
        """Make ``state`` this agent's, or raise :class:`CheckpointError` and leave the
        agent as it was."""
        if state.agent_id != self.agent_id:  # its store checks the file's owner already
            raise CheckpointError(f"it is {state.agent_id!r}'s checkpoint, not {self.agent_id!r}'s")
        check_values(state, self.settings.rounds)
        with self._lock:
            before = self.algorithm.state_dict()
            try:
                self.algorithm.load_state_dict(state.algorithm)
                check_loaded(self.algorithm, before)
            except _UNRESUMABLE as err:
                self.algorithm.load_state_dict(before)
                why = err if isinstance(err, CheckpointError) else f"cannot be resumed ({err})"
                raise CheckpointError(str(why)) from None
            self.round = state.round
            self.holds_past = True
            self._counters = state.counters.copy()
            previous = max(self.lineages.incarnation, state.incarnation)
            self.lineages.restart(new_incarnation(previous))
