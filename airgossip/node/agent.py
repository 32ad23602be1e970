"""``python -m airgossip.emulation.runtime.agent``: one agent process, as the fleets start it.

The flags are ``airgossip agent``'s (:class:`~airgossip.emulation.runtime.command.AgentCommand`); an
error is one line starting ``error:`` and exit code 2, as the CLI's.
"""

from __future__ import annotations

import sys

from airgossip.emulation.runtime.command import parse_agent_command
from airgossip.emulation.runtime.process import AgentProcessError, run_agent_command


def main(argv: list[str] | None = None) -> int:
    """Run the agent of ``argv`` (default: this process's arguments); its exit code."""
    command = parse_agent_command(sys.argv[1:] if argv is None else argv)
    try:
        return run_agent_command(command)
    except AgentProcessError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
