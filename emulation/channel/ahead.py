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

The worker is :mod:`airgossip.emulation.channel.worker` (``python -m
airgossip.emulation.channel.worker FD``, started by :class:`StepsAhead`, not by hand).
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airgossip.emulation.channel.state import LinkState
    from airgossip.scenario.wireless import WirelessSettings

#: Where each array starts in a step's memory file (bytes).
_ALIGN = 64
#: The largest message: a step's pickle without its arrays, the settings.
_MESSAGE_BYTES = 1 << 20

#: A step as the worker hands it over: its pickle without the arrays, where each array lies
#: in the memory file, and the file's descriptor.
Packed = tuple[bytes, list[tuple[int, int]], int]


class WorkerGone(RuntimeError):
    """The worker process failed or ended: the caller computes the step itself."""


def send(sock: socket.socket, message: Any, fd: int | None = None) -> None:
    """One message (pickled, at most ``_MESSAGE_BYTES``), with a descriptor where given."""
    data = pickle.dumps(message, protocol=5)
    if len(data) > _MESSAGE_BYTES:
        raise ValueError(f"a message of {len(data)} bytes (more than {_MESSAGE_BYTES})")
    socket.send_fds(sock, [data], [fd] if fd is not None else [])


def receive(sock: socket.socket) -> tuple[Any, int | None]:
    """One message :func:`send` sent, and its descriptor (None: none came with it)."""
    data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 1)
    if not data:
        for fd in fds:
            os.close(fd)
        raise EOFError("the other end closed the socket")
    return pickle.loads(data), (fds[0] if fds else None)


def pack(state: LinkState) -> Packed:
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
    """What :func:`pack` wrote, its arrays views of the file mapped copy-on-write."""
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
                [sys.executable, "-m", "airgossip.emulation.channel.worker", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            theirs.close()
        self._sock = ours
        send(ours, (settings, n, seed, first))

    def take(self, step: int) -> LinkState:
        try:
            send(self._sock, step)
            (kind, *value), fd = receive(self._sock)
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
