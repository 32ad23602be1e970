"""How many torch CPU threads an agent process takes when ``--threads`` does not say.

torch's own default is every core of the host, in every process: four agents started by hand
on a 2-core host then fight over the cores, each taking them all, and run several times
slower than with one thread each. An agent's local step on a small model gains nothing from
more threads (its matrices are too small to split), so a small model gets one; a larger one
gets the host's cores shared among the agents known to run on it (``--host-agents``: a fleet
knows them, a hand-started agent is told, else it assumes it is alone).
``docs/performance.md`` has the measurement.
"""

from __future__ import annotations

import os

#: Models up to this many parameters train on one thread: a step's matrices are too small
#: for more to help (the digits model has 2,410).
SMALL_MODEL_PARAMETERS = 1_000_000


def host_cores() -> int:
    """The cores this process may run on (its affinity, else the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        return os.cpu_count() or 1


def agent_threads(parameters: int, host_agents: int | None, cores: int) -> int:
    """Threads for an agent whose model has ``parameters`` parameters, sharing ``cores``
    cores with ``host_agents - 1`` other agents (None: unknown, taken as alone)."""
    if parameters <= SMALL_MODEL_PARAMETERS:
        return 1
    return max(1, cores // max(1, host_agents or 1))
