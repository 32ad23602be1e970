"""The certificates of a fleet on one Docker host (the compose stack's ``certs`` service).

Usage: ``fleet_certs.py AUTHORITY CERTS AGENTS``. Makes the fleet's certificate authority in
the folder ``AUTHORITY`` (``airgossip certs init``) unless it is there, then issues
``coordinator`` and ``agent-0`` to ``agent-<AGENTS-1>`` into ``CERTS`` with a copy of
``ca.pem`` (``airgossip certs issue --out``), keeping every certificate that exists: running
it again, or for a larger fleet, changes nothing already issued. The authority's key stays
in ``AUTHORITY``, a volume no other service mounts. One process issues them all, not one
start-up of the CLI per agent.
"""

from __future__ import annotations

import sys
from pathlib import Path

from airgossip.common.identity import agent_ids
from airgossip.common.security.certificates import init_authority, issue
from airgossip.common.security.tls import CA_CERT, COORDINATOR_IDENTITY, SecurityError

#: The largest fleet the script issues for (the entry point claims indices below 4096).
MOST_AGENTS = 4096


def main(argv: list[str]) -> int:
    if len(argv) != 4 or not argv[3].isdigit() or not 1 <= int(argv[3]) <= MOST_AGENTS:
        print(
            f"usage: fleet_certs.py AUTHORITY CERTS AGENTS (AGENTS from 1 to {MOST_AGENTS}), got "
            f"{' '.join(argv[1:]) or 'nothing'}",
            file=sys.stderr,
        )
        return 2
    authority, folder, count = Path(argv[1]), Path(argv[2]), int(argv[3])
    issued = []
    try:
        if not (authority / CA_CERT).exists():
            init_authority(authority)
            issued.append("the certificate authority")
        for identity in [COORDINATOR_IDENTITY, *agent_ids(count)]:
            if not (folder / f"{identity}.pem").exists():
                # A key without its certificate is what an interrupted issue leaves.
                issue(authority, identity, out=folder, overwrite=True)
                issued.append(identity)
    except (SecurityError, OSError) as err:
        print(f"fleet_certs: {err}", file=sys.stderr)
        return 1
    kept = count + 1 - sum(1 for name in issued if name != "the certificate authority")
    print(
        f"fleet_certs: {folder}: issued {', '.join(issued) if issued else 'nothing'}"
        f"{f'; kept {kept} members already there' if kept else ''}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
