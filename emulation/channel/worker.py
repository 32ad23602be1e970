"""The worker process of :class:`~airgossip.emulation.channel.ahead.StepsAhead`.

``python -m airgossip.emulation.channel.worker FD`` (started by ``StepsAhead``, not by hand): reads
``(settings, n, seed, first step)`` from the Unix socket ``FD``, computes step ``first`` at
once, then answers each step number it reads with that step (see
:mod:`airgossip.emulation.channel.ahead`) and computes the next while the caller works; it answers a
failure with its message and exits, and exits when the caller closes the socket.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys

from airgossip.emulation.channel.ahead import Packed, pack, receive, send
from airgossip.emulation.channel.model import ChannelModel


def serve(sock: socket.socket) -> None:
    """The worker's loop (see the module docstring)."""
    (settings, n, seed, first), _ = receive(sock)
    model = ChannelModel(settings, n, seed, cache_steps=1)
    for following in range(first):
        model._advance(following)
    ahead: tuple[int, Packed] | None = (first, pack(model._advance(first)))
    following = first + 1  # the step the model computes next
    while True:
        try:
            step, _ = receive(sock)
        except (EOFError, OSError):  # the run is over
            return
        try:
            if ahead is not None and ahead[0] == step:
                packed = ahead[1]
            else:
                if ahead is not None:
                    os.close(ahead[1][2])
                if step < following:
                    model._restart()
                    following = 0
                while following <= step:
                    state = model._advance(following)
                    following += 1
                packed = pack(state)
                del state
            ahead = None
            send(sock, ("state", packed[0], packed[1]), packed[2])
            os.close(packed[2])
            ahead = (following, pack(model._advance(following)))
            following += 1
        except Exception as err:  # the caller computes the step itself and meets it there
            with contextlib.suppress(OSError):  # (unless it is gone)
                send(sock, ("error", f"{type(err).__name__}: {err}"))
            return


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
