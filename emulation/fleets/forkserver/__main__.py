"""``python -m emulation.fleets.forkserver``: the fork server itself."""

from emulation.fleets.forkserver.server import main

main()
