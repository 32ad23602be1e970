"""One agent process's main: its flags parsed, the agent run to the end on the links its
caller makes (:class:`~airgossip.node.links.Links`).

The flags are ``airgossip agent``'s (:class:`~airgossip.node.command.AgentCommand`); an
error is one line starting ``error:`` and exit code 2, as the CLI's. The fleets start it as
``python -m airgossip.emulation.agent`` (links emulated as the scenario says).
"""

from __future__ import annotations

import sys

from airgossip.node.command import parse_agent_command
from airgossip.node.links import Links
from airgossip.node.process import AgentProcessError, run_agent_command


def main(links: Links, argv: list[str] | None = None, prog: str = "airgossip agent") -> int:
    """Run the agent of ``argv`` (default: this process's arguments) on ``links``; its exit
    code."""
    command = parse_agent_command(sys.argv[1:] if argv is None else argv, prog)
    try:
        return run_agent_command(command, links)
    except AgentProcessError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
