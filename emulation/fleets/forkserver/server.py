"""The server's side: preload, then fork a child per request and become what it asks for
(``python -m airgossip.emulation.fleets.forkserver``; see the package's docstring)."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import json
import os
import random
import runpy
import select
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import IO

from airgossip.common.security.private_files import open_private_fd
from airgossip.emulation.fleets.forkserver.protocol import CHILD_GRACE_S, ForkRequest

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def _prctl(option: int, value: int | bytes) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


class _Server:
    def __init__(self, parent_pid: int, out: IO[bytes]) -> None:
        self.parent_pid = parent_pid
        self.out = out
        self.children: set[int] = set()
        self.stopping = False

    def say(self, **message: bool | int | float | str) -> None:
        with contextlib.suppress(OSError):  # a launcher that is gone reads nothing
            self.out.write((json.dumps(message) + "\n").encode())
            self.out.flush()

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def reap(self) -> None:
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            self.children.discard(pid)
            self.say(exit=pid, code=os.waitstatus_to_exitcode(status))

    def serve(self) -> ForkRequest | None:
        """Answer requests until told to stop; return the request in a forked child, None in
        the server once every child is gone."""
        pending = b""
        while not self.stopping:
            self.reap()
            if os.getppid() != self.parent_pid:
                break
            try:
                readable, _, _ = select.select([0], [], [], 0.1)
            except InterruptedError:
                continue
            if not readable:
                continue
            data = os.read(0, 1 << 16)
            if not data:
                break  # the launcher closed its end: no more agents
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = ForkRequest.parse(line)
                child = self.fork(request)
                if child:
                    return request
        self.stop_children()
        return None

    def fork(self, request: ForkRequest) -> bool:
        """Fork for ``request``: True in the child."""
        # No SIGTERM may run the server's handler in a child that has not reset it yet.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            pid = os.fork()
        except OSError as err:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            self.say(id=request.id, error=str(err))
            return False
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            return True
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self.children.add(pid)
        self.say(id=request.id, pid=pid)
        return False

    def stop_children(self) -> None:
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + CHILD_GRACE_S
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.05)
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while self.children:
            pid, status = os.waitpid(-1, 0)
            self.children.discard(pid)
            self.say(exit=pid, code=os.waitstatus_to_exitcode(status))


def _become(request: ForkRequest) -> None:
    """In a fresh child: take the place of ``python -m MODULE ARGS`` started by Popen with
    its own session, stdin from /dev/null and stdout and stderr to the log; run it."""
    os.setsid()
    _keep_priority()
    log = open_private_fd(Path(request.log), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.chdir(request.cwd)
    args = list(request.args)
    # What `ps -o comm` and `top` show: the agent's id where it has one.
    name = args[args.index("--id") + 1] if "--id" in args[:-1] else request.module
    _prctl(_PR_SET_NAME, name.encode()[:15])
    # A fresh interpreter seeds these from the OS; forked children would share one state.
    # (numpy's generators only where imported: `numpy.random` is imported on first use, and
    # importing it here would give each child a private copy of its 5 MiB; imported later, it
    # seeds itself from the OS.)
    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()
    sys.argv = [request.module, *args]
    os._exit(_run_as_main(request.module))


def _keep_priority() -> None:
    """Where the kernel groups the CPU time of each session (autogroup: a new session is a
    new group, and groups share the cores equally, whatever their processes' niceness), give
    this child's new group the niceness the child has: agents forked by a Ray worker
    (niceness 15) then yield to the driver and the raylets as Ray means them to, instead of
    each taking as much of the cores as the whole driver (64 agents on 2 cores starved its
    coordinator of heartbeats for tens of seconds)."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if nice > 0:
        with contextlib.suppress(OSError):  # no autogroups in this kernel, or no /proc
            Path("/proc/self/autogroup").write_text(f"{nice}\n")


def _run_as_main(module: str) -> int:
    """Run ``module`` as ``__main__`` and end as the interpreter ends a program (non-daemon
    threads joined, ``atexit`` handlers run: logs flushed; the exit code of a SystemExit,
    1 and the traceback for any other exception), short of tearing its modules down: that
    takes a forked agent about a second of CPU and leaves nothing behind that matters (its
    files are closed after every write). The caller exits with the code through
    ``os._exit``, as ``multiprocessing`` ends its forked children."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    return code


def _exit_code(code: object) -> int:
    """The exit status ``SystemExit(code)`` gives a Python program."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    parent_pid = int(args[args.index("--parent-pid") + 1])
    preload = [m for m in args[args.index("--preload") + 1].split(",") if m]
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:
        raise SystemExit("the launcher is gone; not starting")
    out = os.fdopen(os.dup(1), "wb")
    # Nothing but answers on the answer pipe: stray prints of imported modules go to the log.
    os.dup2(2, 1)
    server = _Server(parent_pid, out)
    signal.signal(signal.SIGTERM, server.on_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher handles Ctrl-C
    for module in preload:
        importlib.import_module(module)
    # What the imports made lives as long as every child: out of the collector's reach, a
    # child's collections do not write to (and so copy) every page of it.
    gc.collect()
    gc.freeze()
    cpu_s = time.process_time()
    print(
        f"fork server {os.getpid()}: imported {', '.join(preload) or 'nothing'} "
        f"({len(sys.modules)} modules) in {cpu_s:.2f} s of CPU",
        file=sys.stderr, flush=True,
    )  # fmt: skip
    server.say(ready=True, cpu_s=round(cpu_s, 3))
    request = server.serve()
    if request is None:
        # Every child is reaped and reported; tearing down an interpreter that holds torch
        # takes seconds of CPU and leaves nothing behind that matters.
        out.close()
        sys.stderr.flush()
        os._exit(0)
    out.close()
    _become(request)
