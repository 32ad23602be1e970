"""``python -m airgossip.emulation.fleets.forkserver``: the fork server itself."""

from airgossip.emulation.fleets.forkserver.server import main

main()
