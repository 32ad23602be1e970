"""The certificates of a fleet on one Docker host, in one folder (the compose stack's
``certs`` service writes them into a named volume).

Usage: ``fleet_certs.py DIR AGENTS``. Makes the fleet's certificate authority in ``DIR``
(``airgossip certs init``) unless it is there, then issues ``coordinator`` and ``agent-0``
to ``agent-<AGENTS-1>`` (``airgossip certs issue``), keeping every certificate that exists:
running it again, or for a larger fleet, changes nothing already issued. One process issues
them all (a fleet of 100 takes well under a second, not one start-up of the CLI per agent).
"""

from __future__ import annotations

import sys
from pathlib import Path

from edge.certificates import init_authority, issue
from edge.identity import agent_ids
from edge.security import CA_CERT, COORDINATOR_IDENTITY, SecurityError

#: The largest fleet the script issues for (the entry point claims indices below 4096).
MOST_AGENTS = 4096


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[2].isdigit() or not 1 <= int(argv[2]) <= MOST_AGENTS:
        print(
            f"usage: fleet_certs.py DIR AGENTS (AGENTS from 1 to {MOST_AGENTS}), got "
            f"{' '.join(argv[1:]) or 'nothing'}",
            file=sys.stderr,
        )
        return 2
    folder, count = Path(argv[1]), int(argv[2])
    issued = []
    try:
        if not (folder / CA_CERT).exists():
            init_authority(folder)
            issued.append("the certificate authority")
        for identity in [COORDINATOR_IDENTITY, *agent_ids(count)]:
            if not (folder / f"{identity}.pem").exists():
                # A key without its certificate is what an interrupted issue leaves.
                issue(folder, identity, overwrite=True)
                issued.append(identity)
    except (SecurityError, OSError) as err:
        print(f"fleet_certs: {err}", file=sys.stderr)
        return 1
    kept = count + 2 - len(issued)
    print(
        f"fleet_certs: {folder}: issued {', '.join(issued) if issued else 'nothing'}"
        f"{f'; kept {kept} already there' if kept else ''}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
