"""Real processes and ports: free ports on loopback; finding or killing what a test started."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path


def processes_mentioning(text: str) -> list[int]:
    """PIDs of live processes whose command line contains ``text`` (zombies excluded)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def wait_until_gone(text: str, timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = processes_mentioning(text)
        if not alive:
            return []
        time.sleep(0.2)
    return processes_mentioning(text)


def kill_all(text: str) -> None:
    for pid in processes_mentioning(text):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
