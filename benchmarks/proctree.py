"""What a process tree costs: peak memory (PSS), CPU seconds, and loopback bytes.

A :class:`TreeWatch` samples a command's whole process tree (every process descending from
it, found through ``/proc/*/stat``) every ``interval_s``:

* **peak PSS**: the largest sum over the tree of ``Pss`` from ``/proc/PID/smaps_rollup``
  (proportional set size: shared pages split between the processes that map them, so eight
  agents sharing torch's libraries are not counted eight times);
* **CPU seconds**: for every process ever seen, its last sampled ``utime + stime``, summed,
  plus what the kernel reports for the reaped children of the root (``wait4``); a process
  that lives less than one interval is only counted if its parent reaps it;
* **bytes on the wire**: when the command runs in a network namespace of its own
  (:func:`namespace`, root only), every byte its loopback interface carried (TCP/IP headers
  included), read from the namespace's ``/proc/net/dev`` at the end.

Linux only: the benchmarks read ``/proc`` directly.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def tree(root: int) -> list[int]:
    """``root`` and every process descending from it, now."""
    children = _children_map()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def cpu_seconds(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def pss_bytes(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class TreeCost:
    """What a watched command cost."""

    wall_s: float
    cpu_s: float
    peak_pss_bytes: int
    processes: int
    loopback_bytes: int | None = None
    returncode: int = 0
    #: Why the tree was stopped before it ended (``stalled`` said so), else None.
    stopped: str | None = None


@dataclass
class TreeWatch:
    """Sample the process tree under ``root`` until :meth:`stop`."""

    root: int
    interval_s: float = 0.1
    peak_pss: int = 0
    cpu: dict[int, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> TreeWatch:
        self._thread = threading.Thread(target=self._run, name="tree-watch", daemon=True)
        self._thread.start()
        return self

    def sample(self) -> None:
        total = 0
        for pid in tree(self.root):
            total += pss_bytes(pid)
            seconds = cpu_seconds(pid)
            if seconds is not None:
                # A pid is only ever one process while we watch (pids are not reused that fast).
                self.cpu[pid] = max(seconds, self.cpu.get(pid, 0.0))
        self.peak_pss = max(self.peak_pss, total)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def can_use_namespaces() -> bool:
    """Root with ``ip``: commands can run in a network namespace of their own."""
    return os.geteuid() == 0 and shutil.which("ip") is not None


@contextlib.contextmanager
def namespace() -> Iterator[str]:
    """A fresh network namespace with only loopback up; removed on exit."""
    name = f"agbench-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def loopback_bytes(ns: str) -> int:
    """Bytes sent on ``lo`` in namespace ``ns`` so far (every packet, headers included)."""
    text = subprocess.run(
        ["ip", "netns", "exec", ns, "cat", "/proc/net/dev"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[8])  # transmit bytes
    return 0


def run_watched(
    command: Sequence[str],
    *,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = 900.0,
    isolate_network: bool = True,
    interval_s: float = 0.1,
    stalled: Callable[[], str | None] | None = None,
) -> TreeCost:
    """Run ``command`` (its own session; in its own network namespace when
    ``isolate_network`` and root) and return what its process tree cost. ``stalled``,
    asked twice a second, says why the command will not end by itself (or None): the tree
    is then killed, and what it cost until then is returned with that reason."""
    with contextlib.ExitStack() as stack:
        ns = stack.enter_context(namespace()) if isolate_network and can_use_namespaces() else None
        argv = ["ip", "netns", "exec", ns, *command] if ns else list(command)
        started = time.perf_counter()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        watch = TreeWatch(process.pid, interval_s).start()
        returncode, stopped = -1, None
        try:
            deadline = started + timeout_s
            asked = started
            while True:
                # wait4 on the root: its own and its reaped children's CPU, from the kernel.
                pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                if pid:
                    returncode = os.waitstatus_to_exitcode(status)
                    process.returncode = returncode
                    break
                now = time.perf_counter()
                if now > deadline:
                    raise TimeoutError(f"{command[0]} still running after {timeout_s:.0f} s")
                if stalled is not None and now - asked >= 0.5:
                    asked = now
                    stopped = stalled()
                    if stopped is not None:
                        watch.stop()
                        _kill_session(process.pid)
                        _, status, usage = os.wait4(process.pid, 0)
                        returncode = os.waitstatus_to_exitcode(status)
                        process.returncode = returncode
                        break
                time.sleep(0.05)
        finally:
            watch.stop()
            _kill_session(process.pid)
        wall = time.perf_counter() - started
        # The kernel's figure (the root and every descendant reaped in the tree) is exact but
        # misses daemons that were re-parented away; the samples see those, less the last
        # interval of each process. The larger of the two is the closer.
        cpu = max(usage.ru_utime + usage.ru_stime, sum(watch.cpu.values()))
        lo = loopback_bytes(ns) if ns else None
        return TreeCost(wall, cpu, watch.peak_pss, len(watch.cpu), lo, returncode, stopped)


def _kill_session(sid: int) -> None:
    """SIGKILL whatever is left of the session ``sid`` (a daemon a framework left behind)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) == sid:
                os.kill(int(entry.name), 9)
        except (ProcessLookupError, PermissionError):
            continue
