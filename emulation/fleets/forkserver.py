"""A fork server: one process imports the agents' modules (torch above all) once, then forks
one child per agent, so that a fleet of N agent processes pays its imports once instead of
N times.

The launcher side is :class:`ForkServer` (start it, :meth:`~ForkServer.spawn` a command,
follow each child as a :class:`ForkedChild`, a ``subprocess.Popen`` look-alike). The server
side is this module run as ``python -m emulation.fleets.forkserver``: it imports the modules
it is told to preload, then reads one JSON request a line on stdin (a module to run as
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
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import random
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

#: How long the server waits for its children after SIGTERM before it SIGKILLs them.
CHILD_GRACE_S = 10.0
#: Longest wait for the server to answer a request (it first finishes its imports).
ANSWER_TIMEOUT_S = 180.0

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


class ForkServerError(RuntimeError):
    """The fork server could not start a child, or is gone."""


# -- the launcher's side ------------------------------------------------------------------------


class ForkedChild:
    """A child of the fork server, followed like a ``subprocess.Popen``: ``pid``, ``poll``,
    ``wait``, ``send_signal``, ``terminate``, ``kill``; ``returncode`` as Popen gives it
    (negative: the signal that killed it)."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"agent process {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        # Only while the server has not reported it reaped: its pid is not reused before.
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """Start a fork server that preloads ``preload`` (module names), with ``env`` (what
    every child inherits: set thread counts here, the server's imports read them), its own
    log at ``log_path``, ``label`` on its command line (which its children share: what
    ``ps`` shows of them; the run's folder, say). :meth:`close` stops it and every child it
    still has."""

    def __init__(
        self,
        preload: Sequence[str],
        *,
        env: dict[str, str],
        log_path: Path,
        cwd: Path,
        label: str = "",
    ) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "emulation.fleets.forkserver",
            "--parent-pid", str(os.getpid()), "--preload", ",".join(preload),
            "--label", label,
        ]  # fmt: skip
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=cwd,
                start_new_session=True,  # Ctrl-C reaches the launcher only; it stops agents
            )
        self.log_path = log_path
        #: The server's CPU seconds for its imports, once it said it is ready.
        self.preload_cpu_s: float | None = None
        self._lock = threading.Lock()
        self._answers: dict[int, dict[str, Any]] = {}
        self._answered = threading.Condition(self._lock)
        self._children: dict[int, ForkedChild] = {}
        self._early_exits: dict[int, int] = {}
        self._next_id = 0
        self._gone = False
        self._reader = threading.Thread(target=self._read, name="fork-server", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def spawn(self, module: str, args: Sequence[str], *, log_path: Path, cwd: Path) -> ForkedChild:
        """Fork a child that runs ``python -m module args`` with stdout and stderr to
        ``log_path`` (made anew) in ``cwd``."""
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
        request = {
            "id": request_id, "module": module, "args": list(args),
            "log": str(log_path), "cwd": str(cwd),
        }  # fmt: skip
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write((json.dumps(request) + "\n").encode())
            stdin.flush()
        except OSError:
            raise ForkServerError(self._gone_message()) from None
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        with self._answered:
            while request_id not in self._answers:
                left = deadline - time.monotonic()
                if self._gone or left <= 0:
                    raise ForkServerError(self._gone_message())
                self._answered.wait(left)
            answer = self._answers.pop(request_id)
            if "error" in answer:
                why = answer["error"]
                raise ForkServerError(f"the fork server could not start {module}: {why}")
            child = ForkedChild(self, int(answer["pid"]))
            self._children[child.pid] = child
            if child.pid in self._early_exits:
                child._exit(self._early_exits.pop(child.pid))
            return child

    def _gone_message(self) -> str:
        code = self.process.poll()
        tail = ""
        with contextlib.suppress(OSError):
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
            tail = " | ".join(lines[-3:])
        state = f"exited with code {code}" if code is not None else "did not answer"
        return f"the fork server {state}: {tail or 'no output'} (log: {self.log_path})"

    def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        for line in stdout:
            message = json.loads(line)
            with self._answered:
                if "ready" in message:
                    self.preload_cpu_s = float(message["cpu_s"])
                elif "exit" in message:
                    pid, code = int(message["exit"]), int(message["code"])
                    child = self._children.get(pid)
                    if child is not None:
                        child._exit(code)
                    else:  # exited before its spawn call saw the answer
                        self._early_exits[pid] = code
                else:
                    self._answers[int(message["id"])] = message
                    self._answered.notify_all()
        # The server is gone: its children die with it (the kernel's parent-death signal),
        # but nobody is left to say how; say it was the server.
        self.process.wait()
        with self._answered:
            self._gone = True
            self._answered.notify_all()
            lost = [c for c in self._children.values() if c.returncode is None]
        for child in lost:
            _wait_gone(child.pid, CHILD_GRACE_S + 5.0)
            child._exit(self.process.returncode or -signal.SIGKILL)

    def shutdown(self) -> None:
        """Tell the server to stop (end of requests) without waiting: it SIGTERMs the
        children it still has, waits :data:`CHILD_GRACE_S`, SIGKILLs the rest and exits."""
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()

    def close(self) -> None:
        """Stop the server (see :meth:`shutdown`) and wait for it; SIGKILL it if it has not
        exited well after the grace period it gives its children."""
        if self.process.poll() is None:
            self.shutdown()
            try:
                self.process.wait(timeout=CHILD_GRACE_S + 5.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=CHILD_GRACE_S + 10.0)


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


# -- the server's side --------------------------------------------------------------------------


def _prctl(option: int, value: int | bytes) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


class _Server:
    def __init__(self, parent_pid: int, out: IO[bytes]) -> None:
        self.parent_pid = parent_pid
        self.out = out
        self.children: set[int] = set()
        self.stopping = False

    def say(self, message: dict[str, Any]) -> None:
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
            self.say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    def serve(self) -> dict[str, Any] | None:
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
                request: dict[str, Any] = json.loads(line)
                child = self.fork(request)
                if child:
                    return request
        self.stop_children()
        return None

    def fork(self, request: dict[str, Any]) -> bool:
        """Fork for ``request``: True in the child."""
        # No SIGTERM may run the server's handler in a child that has not reset it yet.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            pid = os.fork()
        except OSError as err:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            self.say({"id": request["id"], "error": str(err)})
            return False
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            return True
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self.children.add(pid)
        self.say({"id": request["id"], "pid": pid})
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
            self.say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _become(request: dict[str, Any]) -> None:
    """In a fresh child: take the place of ``python -m MODULE ARGS`` started by Popen with
    its own session, stdin from /dev/null and stdout and stderr to the log; run it."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.chdir(request["cwd"])
    args = [str(a) for a in request["args"]]
    # What `ps -o comm` and `top` show: the agent's id where it has one.
    name = args[args.index("--id") + 1] if "--id" in args[:-1] else request["module"]
    _prctl(_PR_SET_NAME, name.encode()[:15])
    # A fresh interpreter seeds these from the OS; forked children would share one state.
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()
    sys.argv = [request["module"], *args]
    os._exit(_run_as_main(request["module"]))


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
    cpu_s = time.process_time()
    print(
        f"fork server {os.getpid()}: imported {', '.join(preload) or 'nothing'} "
        f"({len(sys.modules)} modules) in {cpu_s:.2f} s of CPU",
        file=sys.stderr, flush=True,
    )  # fmt: skip
    server.say({"ready": True, "cpu_s": round(cpu_s, 3)})
    request = server.serve()
    if request is None:
        # Every child is reaped and reported; tearing down an interpreter that holds torch
        # takes seconds of CPU and leaves nothing behind that matters.
        out.close()
        sys.stderr.flush()
        os._exit(0)
    out.close()
    _become(request)


if __name__ == "__main__":
    main()
