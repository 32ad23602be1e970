"""A dense channel model's next step computed in a process of its own while the run goes on.

A dense step of 1,000 nodes is a quarter of a second of NumPy (lte-urban: nine of them in a
100-round run, over a tenth of it) during which an event loop in the same process waits. The
steps are a sequence (positions, shadowing and fading carry over), so a second process that
holds its own copy of the model computes step k + 1 while the run works in step k: the same
code and seeds give the same arrays. They are handed over without a copy: the worker writes
a step's arrays into a memory file (``memfd``) and passes its descriptor over a Unix socket
with the step's pickle (protocol 5, the arrays out of band); the caller maps the file
copy-on-write and unpickles the arrays as views of the mapping, which lives as long as they
do. (Pickled whole through the socket, the 35 MB of a 1,000-node step took the caller
0.1-0.2 s a step to read.)

``python -m emulation.channel.ahead FD`` is the worker (started by :class:`StepsAhead`, not
by hand): it reads ``(settings, n, seed, first step)`` and then step numbers from the
socket ``FD`` and answers each with the step, or with an error and exits.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from emulation.channel.state import LinkState
    from emulation.scenario import WirelessSettings

#: Where each array starts in a step's memory file (bytes).
_ALIGN = 64
#: The largest message: a step's pickle without its arrays, the settings.
_MESSAGE_BYTES = 1 << 20

#: A step as the worker hands it over: its pickle without the arrays, where each array lies
#: in the memory file, and the file's descriptor.
_Packed = tuple[bytes, list[tuple[int, int]], int]


class WorkerGone(RuntimeError):
    """The worker process failed or ended: the caller computes the step itself."""


def _send(sock: socket.socket, message: Any, fd: int | None = None) -> None:
    data = pickle.dumps(message, protocol=5)
    if len(data) > _MESSAGE_BYTES:
        raise ValueError(f"a message of {len(data)} bytes (more than {_MESSAGE_BYTES})")
    socket.send_fds(sock, [data], [fd] if fd is not None else [])


def _receive(sock: socket.socket) -> tuple[Any, int | None]:
    data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 1)
    if not data:
        for fd in fds:
            os.close(fd)
        raise EOFError("the other end closed the socket")
    return pickle.loads(data), (fds[0] if fds else None)


def _pack(state: LinkState) -> _Packed:
    """``state`` in a memory file (the caller closes the descriptor)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(state, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    places, size = [], 0
    for view in views:
        size = -(-size // _ALIGN) * _ALIGN
        places.append((size, view.nbytes))
        size += view.nbytes
    fd = os.memfd_create("airgossip-channel-step", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(size, 1))
        with mmap.mmap(fd, max(size, 1)) as out:
            for view, (start, nbytes) in zip(views, places, strict=True):
                out[start : start + nbytes] = view
    except BaseException:
        os.close(fd)
        raise
    return head, places, fd


def _unpack(head: bytes, places: list[tuple[int, int]], fd: int) -> Any:
    """What :func:`_pack` wrote, its arrays views of the file mapped copy-on-write."""
    try:
        mapped = mmap.mmap(fd, max(os.fstat(fd).st_size, 1), access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    whole = memoryview(mapped)
    return pickle.loads(head, buffers=[whole[start : start + n] for start, n in places])


class StepsAhead:
    """The worker process of one model: :meth:`take` gives step ``k`` (computed while the
    caller worked in step ``k - 1`` where asked in order; any other step is computed on
    demand, replaying from step 0 for an older one). The worker starts on step ``first``
    at once (computing the steps before it too)."""

    def __init__(self, settings: WirelessSettings, n: int, seed: int, *, first: int = 0) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        # The worker imports the package as this process does (a checkout on sys.path too).
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "emulation.channel.ahead", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            theirs.close()
        self._sock = ours
        _send(ours, (settings, n, seed, first))

    def take(self, step: int) -> LinkState:
        try:
            _send(self._sock, step)
            (kind, *value), fd = _receive(self._sock)
        except (EOFError, OSError) as err:
            self.close()
            raise WorkerGone(
                f"the channel worker process ended (exit code {self._process.poll()}): {err}"
            ) from None
        if kind != "state" or fd is None:
            if fd is not None:
                os.close(fd)
            self.close()
            raise WorkerGone(f"the channel worker failed: {value[0]}")
        head, places = value
        state: LinkState = _unpack(head, places, fd)
        return state

    def close(self) -> None:
        """Stop the worker (it holds nothing worth keeping)."""
        self._sock.close()
        if self._process.poll() is None:
            self._process.terminate()
            self._process.wait()


def serve(sock: socket.socket) -> None:
    """The worker's loop (see the module docstring)."""
    from emulation.channel.model import ChannelModel

    (settings, n, seed, first), _ = _receive(sock)
    model = ChannelModel(settings, n, seed, cache_steps=1)
    for following in range(first):
        model._advance(following)
    ahead: tuple[int, _Packed] | None = (first, _pack(model._advance(first)))
    following = first + 1  # the step the model computes next
    while True:
        try:
            step, _ = _receive(sock)
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
                packed = _pack(state)
                del state
            ahead = None
            _send(sock, ("state", packed[0], packed[1]), packed[2])
            os.close(packed[2])
            ahead = (following, _pack(model._advance(following)))
            following += 1
        except Exception as err:  # the caller computes the step itself and meets it there
            with contextlib.suppress(OSError):  # (unless it is gone)
                _send(sock, ("error", f"{type(err).__name__}: {err}"))
            return


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
