"""The agent: its round loop (:mod:`.agent`), what it admits (:mod:`.admission`), its
checkpoints (:mod:`.checkpoints`, :mod:`.checkpointing`) and how it waits for in-neighbours
(:mod:`.waiting`). Every way of running agents builds them with :func:`build_agent`."""

from edge.agent.agent import (
    FORMER_ROUNDS,
    PATIENCE_ROUNDS,
    PROBE_ROUNDS,
    Agent,
    build_agent,
    check_task_fits,
    fleet_digest,
    hold_back,
)

__all__ = [
    "FORMER_ROUNDS",
    "PATIENCE_ROUNDS",
    "PROBE_ROUNDS",
    "Agent",
    "build_agent",
    "check_task_fits",
    "fleet_digest",
    "hold_back",
]
