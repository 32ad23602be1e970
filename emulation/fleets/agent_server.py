"""The agent processes' fork server: what it preloads, and starting it before the run is
checked.

The launcher imports torch to check the settings (codecs, algorithms, the task), and every
agent is forked from the fork server (:mod:`airgossip.emulation.fleets.forkserver`), which
needs it too. The command line forks the server from itself as soon as the settings are
checked (:func:`warm_fork_server` with ``here``): one import of torch for the launcher, the
server and every agent, in pages they share (a server started as its own interpreter holds
a second copy: about 140 MiB of the fleet's memory), and the run's own checks (its
preflight) go on beside the server's remaining imports. The fleet takes the server over when
it starts its agents (:func:`take_warm_fork_server`), moving its log into the run's folder.
A run refused in between stops the server at exit; a server that died is not taken (the
fleet starts its own, as its own interpreter).

This module imports neither torch nor the fleets.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from airgossip.edge.algorithms.registry import ALGORITHMS
from airgossip.edge.tasks.registry import BUILTIN_TASKS
from airgossip.emulation.fleets.forkserver import ForkServer

#: What a fleet runs as ``python -m`` for one agent process (no module of the CLI).
AGENT_MODULE = "airgossip.emulation.agent"

#: What the fork server imports before it forks agents: everything an agent process imports
#: (torch, gRPC, the agent, its links, every registered algorithm and the built-in tasks but
#: Flower's, whose registries import them only when looked up, and what those import on
#: first use: numpy's generators, gRPC's server and channel, the TLS backend), none of which
#: starts a thread, a gRPC channel or torch's thread pool on import. A module a child imports
#: itself is a private copy in each child (numpy's generators alone: 5 MiB an agent).
AGENT_PRELOAD = (
    "numpy.random",
    "grpc._server",
    "grpc._channel",
    "grpc.experimental",
    "cryptography.hazmat.backends.openssl.backend",
    "airgossip.node.agent",
    "airgossip.node.process",
    "airgossip.emulation.networks.static",
    "airgossip.emulation.networks.kernel.agent",
    *dict.fromkeys(ALGORITHMS.target(name).partition(":")[0] for name in ALGORITHMS),
    *dict.fromkeys(
        BUILTIN_TASKS.target(name).partition(":")[0] for name in BUILTIN_TASKS if name != "flower"
    ),
)
#: What the agents of a wireless run import besides (the channel model and SciPy: about
#: 0.3 s of the server's start, which a static run does without).
WIRELESS_PRELOAD = ("airgossip.emulation.networks.wireless",)


def agent_preload(*, wireless: bool) -> tuple[str, ...]:
    """The fork server's imports for agents of a wireless run, or of a static one."""
    return (*AGENT_PRELOAD, *WIRELESS_PRELOAD) if wireless else AGENT_PRELOAD


#: The file a fork server's log has in a run's folder.
LOG_NAME = "forkserver.log"


def can_fork() -> bool:
    """Whether agents here are forked from a fork server (Linux, where ``fork`` exists)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def agent_environment() -> dict[str, str]:
    """The environment of every agent process: one torch thread each (read when torch is
    imported, so the fork server is started with it too), unbuffered output to its log."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def start_fork_server(
    log_path: Path, label: str, *, wireless: bool, here: bool = False
) -> ForkServer:
    """A fork server for agent processes on this machine (of a ``wireless`` run or not), its
    log at ``log_path``, ``label`` (the run's folder) on its command line; ``here``: forked
    from this process (see :class:`ForkServer`), where this process runs no other thread."""
    return ForkServer(
        agent_preload(wireless=wireless), env=agent_environment(), log_path=log_path,
        cwd=Path.cwd(), label=label, here=here and threading.active_count() == 1,
    )  # fmt: skip


class _Warm:
    """The one fork server started ahead of its run, and the private folder of its log."""

    server: ForkServer | None = None
    folder: Path | None = None
    wireless = False


def warm_fork_server(label: str, *, wireless: bool, here: bool = False) -> None:
    """Start the fork server of a process fleet about to run here (``label``: its run's
    folder; ``wireless``: its links are; ``here``: forked from this process), unless one is
    already warm; its log waits in a private temporary folder. Nothing where agents are not
    forked (:func:`can_fork`)."""
    if not can_fork():
        return
    server = _Warm.server
    if server is not None and server.process.poll() is None and _Warm.wireless == wireless:
        return
    _discard()
    folder = Path(tempfile.mkdtemp(prefix="airgossip-forkserver-"))  # 0700
    _Warm.folder, _Warm.wireless = folder, wireless
    _Warm.server = start_fork_server(folder / LOG_NAME, label, wireless=wireless, here=here)
    atexit.register(_discard)


def take_warm_fork_server(log_path: Path, *, wireless: bool) -> ForkServer | None:
    """The warm fork server, now the caller's, its log moved to ``log_path``; None where none
    was started, it is gone, or it did not preload a ``wireless`` run's modules (the caller
    starts its own)."""
    server, folder = _Warm.server, _Warm.folder
    _Warm.server = _Warm.folder = None
    if server is None:
        return None
    if (server.process.poll() is not None or server.cwd != Path.cwd()
            or (wireless and not _Warm.wireless)):  # fmt: skip
        server.close()
        _remove(folder)
        return None
    if server.move_log(log_path):
        _remove(folder)
    else:  # copied when the server closes, then removed
        atexit.register(_remove, folder)
    return server


def _discard() -> None:
    """Stop a warm fork server nobody took (a run refused after it started)."""
    server, folder = _Warm.server, _Warm.folder
    _Warm.server = _Warm.folder = None
    if server is not None:
        server.close()
    _remove(folder)


def _remove(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
