"""The launcher's side of the fork server: start it, spawn children, follow each one."""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from airgossip.common.security.private_files import open_private, private_folder
from airgossip.emulation.fleets.forkserver.protocol import (
    ANSWER_TIMEOUT_S,
    CHILD_GRACE_S,
    ForkAnswer,
    ForkRequest,
    ForkServerError,
)


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
    still has.

    ``here``: fork the server from this process instead of starting a new interpreter, so
    that what this process imported (torch above all) is the server's and its children's
    too, in pages they share with it rather than in a second copy. Only from a process that
    runs no thread but its main one and has not run torch's thread pool (see the package's
    docstring); ``env`` then reaches the children's environment but not what this process
    imported already.
    """

    def __init__(
        self,
        preload: Sequence[str],
        *,
        env: dict[str, str],
        log_path: Path,
        cwd: Path,
        label: str = "",
        here: bool = False,
    ) -> None:
        private_folder(log_path.parent)
        arguments = [
            "--parent-pid", str(os.getpid()), "--preload", ",".join(preload), "--label", label,
        ]  # fmt: skip
        with open_private(log_path, "wb") as log:
            self.process: subprocess.Popen[bytes] | ForkedServer
            if here:
                self.process = ForkedServer.start(arguments, env=env, log_fd=log.fileno(), cwd=cwd)
            else:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "airgossip.emulation.fleets.forkserver", *arguments],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,  # Ctrl-C reaches the launcher only; it stops agents
                )
        self.log_path = log_path
        self.cwd = cwd
        self._copy_log_to: Path | None = None
        #: The server's CPU seconds for its imports, once it said it is ready.
        self.preload_cpu_s: float | None = None
        self._lock = threading.Lock()
        self._answers: dict[int, ForkAnswer] = {}
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

    def move_log(self, path: Path) -> bool:
        """Move the server's log to ``path``: renamed where both are on one file system (the
        server goes on writing to it; True), else copied there now and again when the server
        closes (False)."""
        try:
            os.replace(self.log_path, path)
        except OSError:
            _copy_private(self.log_path, path)
            self._copy_log_to = path
            return False
        self.log_path = path
        return True

    def spawn(self, module: str, args: Sequence[str], *, log_path: Path, cwd: Path) -> ForkedChild:
        """Fork a child that runs ``python -m module args`` with stdout and stderr to
        ``log_path`` (made anew) in ``cwd``."""
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
        request = ForkRequest(request_id, module, tuple(args), str(log_path), str(cwd))
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(request.line())
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
            if answer.pid is None:
                why = answer.error
                raise ForkServerError(f"the fork server could not start {module}: {why}")
            child = ForkedChild(self, answer.pid)
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
                    pid = message.get("pid")
                    self._answers[int(message["id"])] = ForkAnswer(
                        int(pid) if pid is not None else None, message.get("error")
                    )
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
        if self._copy_log_to is not None:
            with contextlib.suppress(OSError):
                _copy_private(self.log_path, self._copy_log_to)


class ForkedServer:
    """A fork server forked from this process (``ForkServer(here=True)``), followed as the
    server started with ``subprocess.Popen`` is: ``pid``, ``stdin`` (requests), ``stdout``
    (answers), ``poll``, ``wait``, ``kill``, ``returncode``."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self.returncode: int | None = None
        self._lock = threading.Lock()

    @classmethod
    def start(
        cls, arguments: Sequence[str], *, env: dict[str, str], log_fd: int, cwd: Path
    ) -> ForkedServer:
        """Fork the server: in the child, what ``python -m airgossip.emulation.fleets.
        forkserver ARGUMENTS`` would be (a session of its own, requests on stdin, answers on
        stdout, stderr to ``log_fd``, ``env``, ``cwd``, none of this process's exit
        handlers), then its ``main``."""
        requests, to_server = os.pipe()
        from_server, answers = os.pipe()
        # What this process made so far lives as long as it: out of the collector's reach,
        # the server's first collection does not write to (and so copy) every page of it.
        gc.collect()
        gc.freeze()
        for stream in (sys.stdout, sys.stderr):  # nothing of ours written twice by children
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setsid()  # Ctrl-C reaches the launcher only; it stops agents
                os.dup2(requests, 0)
                os.dup2(answers, 1)
                os.dup2(log_fd, 2)
                # Nothing else of this process's: as Popen's close_fds leaves a new server.
                for name in os.listdir("/proc/self/fd"):
                    if int(name) > 2:
                        with contextlib.suppress(OSError):
                            os.close(int(name))
                os.chdir(cwd)
                os.environ.clear()
                os.environ.update(env)
                atexit._clear()  # the launcher's handlers are the launcher's
                from airgossip.emulation.fleets.forkserver.server import _exit_code, main

                try:
                    main(arguments)  # never returns: it ends with os._exit, or becomes a child
                except SystemExit as err:  # as the interpreter of a started server ends it
                    code = _exit_code(err.code)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(requests)
        os.close(answers)
        return cls(pid, os.fdopen(to_server, "wb"), os.fdopen(from_server, "rb"))

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                with contextlib.suppress(ChildProcessError):
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"fork server {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        return code

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _copy_private(source: Path, target: Path) -> None:
    with open_private(target, "wb") as out:
        out.write(source.read_bytes())


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
