"""An agent's default torch threads: one for a small model, else the host's cores shared
among the agents on it (``benchmarks/host_threads.py`` measures what this saves)."""

from __future__ import annotations

import pytest

from airgossip.node.command import AgentCommand, check_command
from airgossip.node.threads import SMALL_MODEL_PARAMETERS, agent_threads, host_cores
from airgossip.scenario.config import ConfigError


@pytest.mark.parametrize(
    ("parameters", "host_agents", "cores", "threads"),
    [
        (2_410, None, 16, 1),  # digits: one thread whatever the host
        (2_410, 1, 16, 1),
        (SMALL_MODEL_PARAMETERS, 2, 16, 1),
        (SMALL_MODEL_PARAMETERS + 1, None, 16, 16),  # alone (or not told): every core
        (SMALL_MODEL_PARAMETERS + 1, 4, 16, 4),  # the cores shared
        (SMALL_MODEL_PARAMETERS + 1, 3, 16, 5),
        (25_000_000, 32, 16, 1),  # more agents than cores: one each, never zero
    ],
)
def test_threads_from_the_model_and_the_agents_on_the_host(
    parameters: int, host_agents: int | None, cores: int, threads: int
) -> None:
    assert agent_threads(parameters, host_agents, cores) == threads


def test_host_cores_is_what_this_process_may_use() -> None:
    assert 1 <= host_cores() <= 4096


@pytest.mark.parametrize(("flag", "value"), [("threads", 0), ("host_agents", 0)])
def test_zero_threads_or_agents_is_refused(flag: str, value: int) -> None:
    command = AgentCommand(coordinator="127.0.0.1:1", insecure=True, **{flag: value})
    with pytest.raises(ConfigError, match=f"--{flag.replace('_', '-')} must be 1 or more"):
        check_command(command)
