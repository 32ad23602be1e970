"""A fork server: one process imports the agents' modules (torch above all) once, then forks
one child per agent, so that a fleet of N agent processes pays its imports once instead of
N times.

The launcher side is :class:`ForkServer` (start it, :meth:`~ForkServer.spawn` a command, follow each
child as a :class:`ForkedChild`, a ``subprocess.Popen`` look-alike). The server side is this module
run as ``python -m airgossip.emulation.fleets.forkserver`` (or the same ``main`` in a fork of
the launcher: ``ForkServer(here=True)``, which shares the launcher's imports): it imports
the modules it is told to preload, then reads one JSON request a line on stdin (a module to run as
``python -m`` would, its arguments, a log file, a working folder), forks, and answers the
child's pid on stdout; when a child exits it writes its exit code (negative: killed by that
signal, as ``Popen.returncode``). A child behaves like a process started with ``python -m
MODULE ARGS``: a session of its own, stdin from ``/dev/null``, stdout and stderr to its log,
default signal handlers, the interpreter's exit (threads joined, ``atexit`` run, the exit
code of its ``SystemExit``) short of tearing its modules down.

What must not happen in the server before a fork, and does not: gRPC started (its core is
not fork-safe once it has threads, channels or servers; importing ``grpc`` starts none) and
torch's intra-op thread pool started (a forked child cannot use an OpenMP pool its parent
started; importing torch starts none). The server runs no thread of its own for the same
reason: it watches its parent and reaps its children from one ``select`` loop.

The server dies with its launcher (SIGTERM from the kernel when the launcher dies, and a check
of its parent in the loop); stopping, it SIGTERMs its children, waits a grace period, and
SIGKILLs what is left. A child started with ``--parent-pid SERVER`` dies with the server.

The package by side: :mod:`.protocol` (the requests and answers on the pipes, the grace
periods), :mod:`.launcher` (:class:`ForkServer`, :class:`ForkedChild`) and :mod:`.server`
(what ``python -m airgossip.emulation.fleets.forkserver`` runs).
"""

from airgossip.emulation.fleets.forkserver.launcher import ForkedChild, ForkServer
from airgossip.emulation.fleets.forkserver.protocol import ForkServerError

__all__ = ["ForkServer", "ForkServerError", "ForkedChild"]
