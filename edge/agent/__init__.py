"""The agent: its round loop (:mod:`.agent`), what it admits (:mod:`.inbound`,
:mod:`.admission`), its checkpoints (:mod:`.resuming`, :mod:`.checkpoints`,
:mod:`.checkpointing`), how it waits for in-neighbours (:mod:`.pacing`, :mod:`.waiting`), and how
one is built from settings (:mod:`.build`)."""

from airgossip.edge.agent.admission import FORMER_ROUNDS
from airgossip.edge.agent.agent import Agent
from airgossip.edge.agent.build import build_agent, check_task_fits, fleet_digest
from airgossip.edge.agent.pacing import PATIENCE_ROUNDS
from airgossip.edge.agent.sending import PROBE_ROUNDS, hold_back

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
