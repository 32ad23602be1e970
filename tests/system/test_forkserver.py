"""The fork server as the fleets use it: real forked processes, real signals, real logs.

Its children must behave like the agent processes they replace: their own pid, session and
log, default signal handlers, exit codes as ``Popen`` reports them (a kill -9 seen as -9),
random generators seeded apart, and nothing of the server's left open in them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airgossip.emulation.fleets.agent_server import agent_environment
from airgossip.emulation.fleets.base import FleetError, ProgressKeeper
from airgossip.emulation.fleets.forkserver import ForkServer
from airgossip.emulation.fleets.processes import AgentProcesses
from airgossip.node.command import AgentCommand
from airgossip.node.folder import RunFolder
from airgossip.scenario.config import load_config
from tests.support.cli import ROOT
from tests.support.processes import kill_all, processes_mentioning, wait_until_gone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PROBE = """\
import json, os, random, signal, sys, time
import numpy, torch
print(json.dumps({
    "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "cwd": os.getcwd(),
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    "argv": sys.argv[1:], "comm": open("/proc/self/comm").read().strip(),
    "numpy.random before use": "numpy.random" in sys.modules,
    "random": random.random(), "numpy": float(numpy.random.rand()),
    "torch": float(torch.rand(1)), "seeded": torch.manual_seed(7) and float(torch.rand(1)),
    "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "omp": os.environ.get("OMP_NUM_THREADS"),
    "nice": os.getpriority(os.PRIO_PROCESS, 0),
    "autogroup": (open("/proc/self/autogroup").read().strip()
                  if os.path.exists("/proc/self/autogroup") else None),
}), flush=True)
mode = sys.argv[1]
if mode == "crash":
    raise RuntimeError("the probe crashed on purpose")
if mode == "sleep":
    time.sleep(600)
sys.exit(int(mode))
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ForkServer]:
    (tmp_path / "forkprobe.py").write_text(PROBE)
    env = {**agent_environment(), "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    made = ForkServer(
        ["torch", "numpy"], env=env, log_path=tmp_path / "server.log", cwd=ROOT,
        label=str(tmp_path),
    )  # fmt: skip
    yield made
    made.close()
    kill_all(str(tmp_path))


def probe(server: ForkServer, tmp_path: Path, name: str, *args: str) -> tuple[object, Path]:
    log = tmp_path / f"{name}.log"
    return server.spawn("forkprobe", [*args, "--id", name], log_path=log, cwd=tmp_path), log


def reported(log: Path) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        lines = log.read_text().splitlines() if log.exists() else []
        if lines and lines[0].endswith("}"):
            return dict(json.loads(lines[0]))
        time.sleep(0.05)
    raise AssertionError(f"the probe wrote nothing to {log}")


def test_children_are_processes_of_their_own(server: ForkServer, tmp_path: Path) -> None:
    a, a_log = probe(server, tmp_path, "agent-0", "3")
    b, b_log = probe(server, tmp_path, "agent-1", "0")
    assert a.wait(60) == 3 and b.wait(60) == 0  # type: ignore[attr-defined]
    first, second = reported(a_log), reported(b_log)
    assert first["pid"] == a.pid and first["pid"] != second["pid"]  # type: ignore[attr-defined]
    assert first["ppid"] == server.pid and first["sid"] == first["pid"]  # own session
    assert first["cwd"] == str(tmp_path) and first["argv"] == ["3", "--id", "agent-0"]
    assert first["comm"] == "agent-0"
    # stdin, stdout, stderr and nothing the server held (its request and answer pipes).
    assert first["fds"][:3] == [0, 1, 2] and len(first["fds"]) <= 4, first["fds"]
    assert first["sigterm"] and first["sigint"] and first["omp"] == "1"
    # Unseeded generators differ between children, as between fresh interpreters; a seeded
    # one draws what a fresh interpreter draws.
    for key in ("random", "numpy", "torch"):
        assert first[key] != second[key], key
    # numpy's generators, not imported by the server, were not imported to seed them (a
    # private copy of their 5 MiB in every child): imported on first use, seeded from the OS.
    assert first["numpy.random before use"] is False
    fresh = subprocess.run(
        [sys.executable, "-c", "import torch; torch.manual_seed(7); print(float(torch.rand(1)))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert first["seeded"] == second["seeded"] == float(fresh.stdout)


def test_a_child_killed_with_sigkill_is_seen_dead(server: ForkServer, tmp_path: Path) -> None:
    child, log = probe(server, tmp_path, "agent-0", "sleep")
    reported(log)
    assert child.poll() is None  # type: ignore[attr-defined]
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    assert child.wait(30) == -signal.SIGKILL  # type: ignore[attr-defined]
    # The server goes on forking.
    other, _ = probe(server, tmp_path, "agent-1", "5")
    assert other.wait(60) == 5  # type: ignore[attr-defined]


def test_a_crash_is_in_the_childs_log(server: ForkServer, tmp_path: Path) -> None:
    child, log = probe(server, tmp_path, "agent-0", "crash")
    assert child.wait(60) == 1  # type: ignore[attr-defined]
    assert "RuntimeError: the probe crashed on purpose" in log.read_text()


def test_closing_the_server_stops_its_children(server: ForkServer, tmp_path: Path) -> None:
    children = [probe(server, tmp_path, f"agent-{i}", "sleep") for i in range(2)]
    for _, log in children:
        reported(log)
    server.close()
    for child, _ in children:
        assert child.wait(30) == -signal.SIGTERM  # type: ignore[attr-defined]
    assert wait_until_gone(str(tmp_path)) == []


def test_the_server_dies_with_its_launcher(tmp_path: Path) -> None:
    (tmp_path / "forkprobe.py").write_text(PROBE)
    launcher = subprocess.Popen(
        [sys.executable, "-c", (
            "import os, sys, time; from pathlib import Path\n"
            "from airgossip.emulation.fleets.forkserver import ForkServer\n"
            "s = ForkServer(['torch'], env=dict(os.environ),"
            f" log_path=Path({str(tmp_path / 's.log')!r}),"
            f" cwd=Path('.'), label={str(tmp_path)!r})\n"
            f"s.spawn('forkprobe', ['sleep'], log_path=Path({str(tmp_path / 'c.log')!r}),"
            " cwd=Path('.'))\n"
            "print('spawned', flush=True); time.sleep(600)\n"
        )],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"},
    )  # fmt: skip
    try:
        assert launcher.stdout is not None and launcher.stdout.readline() == "spawned\n"
        # This launcher (its command names the folder), the server and its child.
        assert len(processes_mentioning(str(tmp_path))) == 3
        launcher.kill()
        launcher.wait(10)
        assert wait_until_gone(str(tmp_path), timeout=20) == []
    finally:
        launcher.kill()
        kill_all(str(tmp_path))


def test_an_agent_that_fails_is_reported_with_its_error(tmp_path: Path) -> None:
    """The fleet's own helper: a forked agent that exits at once is a FleetError naming
    the agent, its exit code and the error line from its log."""
    config = load_config(None, {"agents": 2, "rounds": 2, "mode": "process"})
    folder = RunFolder(tmp_path / "run")  # its config.json never written
    missing = folder.config_path
    group = AgentProcesses(config, folder, ProgressKeeper(config, None))
    try:
        assert group.fork_server is not None
        agent = group.spawn(0, "agent-0", AgentCommand(coordinator="127.0.0.1:1"))
        assert agent.process.wait(120) == 2
        with pytest.raises(FleetError) as caught:
            group.monitor(lambda: 0)
        message = str(caught.value)
        assert "agent-0 exited with code 2 before finishing" in message
        assert str(missing) in message and "agent-0.log" in message
    finally:
        group.terminate()


def test_a_warm_server_is_taken_over_with_its_log(tmp_path: Path) -> None:
    from airgossip.emulation.fleets import agent_server

    agent_server.warm_fork_server(label=str(tmp_path), wireless=False)
    warm = agent_server._Warm.server
    assert warm is not None and warm.process.poll() is None
    temporary = warm.log_path.parent
    assert temporary.name.startswith("airgossip-forkserver-")
    assert temporary.stat().st_mode & 0o777 == 0o700
    agent_server.warm_fork_server(label=str(tmp_path), wireless=False)  # one is warm: no second
    assert agent_server._Warm.server is warm
    log = tmp_path / "forkserver.log"
    taken = agent_server.take_warm_fork_server(log, wireless=False)
    try:
        assert taken is warm and taken.log_path == log
        assert not temporary.exists()
        assert agent_server.take_warm_fork_server(log, wireless=False) is None  # taken once
        child = taken.spawn("json.tool", ["--help"], log_path=tmp_path / "child.log", cwd=tmp_path)
        assert child.wait(timeout=120) == 0
        line = log.read_text()  # the server's own line, in the moved log
        assert "imported" in line and "networks.wireless" not in line  # a static run's
    finally:
        if taken is not None:
            taken.close()
    wait_until_gone(str(tmp_path))


def watch_for_warm_server(folder: Path, seen: list[str], stop: threading.Event) -> None:
    while not stop.is_set():
        seen += [p.name for p in folder.glob("airgossip-forkserver-*") if p.name not in seen]
        time.sleep(0.01)


@pytest.mark.parametrize("refused", [False, True])
def test_the_command_line_starts_the_fork_server_ahead_and_leaves_nothing(
    tmp_path: Path, refused: bool
) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    out = tmp_path / "run"
    args = ["run", "--task", "consensus", "--agents", "3", "--rounds", "3", "--out", str(out)]
    if refused:
        args += ["--device", "cuda"]  # passes the early checks, refused by the run's preflight
    seen: list[str] = []
    stop = threading.Event()
    watcher = threading.Thread(target=watch_for_warm_server, args=(temporary, seen, stop))
    watcher.start()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "airgossip", *args], capture_output=True, text=True,
            timeout=180, cwd=ROOT, env={**os.environ, "TMPDIR": str(temporary)},
        )  # fmt: skip
    finally:
        stop.set()
        watcher.join()
    assert len(seen) == 1, seen  # the server was started ahead of the run, once
    # and its temporary folder is gone (other libraries may leave their own in TMPDIR)
    assert list(temporary.glob("airgossip-forkserver-*")) == []
    assert wait_until_gone(str(out)) == []
    if refused:
        assert result.returncode == 2 and "CUDA" in result.stderr
        assert not out.exists()
    else:
        assert result.returncode == 0, result.stderr
        assert "imported" in (out / "forkserver.log").read_text()
        assert (out / "forkserver.log").stat().st_mode & 0o777 == 0o600


def test_a_static_runs_warm_server_is_not_taken_for_a_wireless_run(tmp_path: Path) -> None:
    from airgossip.emulation.fleets import agent_server

    agent_server.warm_fork_server(label=str(tmp_path), wireless=False)
    warm = agent_server._Warm.server
    assert warm is not None
    assert agent_server.take_warm_fork_server(tmp_path / "f.log", wireless=True) is None
    assert warm.process.poll() is not None  # stopped, not left behind
    assert agent_server._Warm.server is None


def test_a_niced_servers_children_give_their_session_that_niceness(tmp_path: Path) -> None:
    """A child is a session of its own, which the kernel's autogroups weigh as much as any
    other whatever its niceness: a child of a server at niceness 7 (as a Ray worker's,
    at 15) sets its group's to 7, so that it yields to its launcher as the niceness says."""
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("this kernel groups no sessions (no /proc/self/autogroup)")
    (tmp_path / "forkprobe.py").write_text(PROBE)
    log = tmp_path / "c.log"
    launcher = subprocess.run(
        ["nice", "-n", "7", sys.executable, "-c", (
            "import os; from pathlib import Path\n"
            "from airgossip.emulation.fleets.forkserver import ForkServer\n"
            "s = ForkServer(['torch'], env=dict(os.environ),"
            f" log_path=Path({str(tmp_path / 's.log')!r}), cwd=Path('.'), label='')\n"
            f"child = s.spawn('forkprobe', ['0'], log_path=Path({str(log)!r}), cwd=Path('.'))\n"
            "assert child.wait(60) == 0\n"
            "s.close()\n"
        )],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"},
    )  # fmt: skip
    assert launcher.returncode == 0, launcher.stderr[-2000:]
    child = reported(log)
    assert child["nice"] == 7
    assert str(child["autogroup"]).endswith(" nice 7"), child["autogroup"]


def test_a_server_forked_from_its_launcher_gives_children_as_a_started_one_does(
    tmp_path: Path,
) -> None:
    """``ForkServer(here=True)``, as the command line uses it: the server is a fork of the
    launcher (after the launcher imported torch), and its children are still processes of
    their own: their session, their log and nothing else open, the agents' environment,
    generators seeded apart, the launcher's exit handlers not theirs; and the server holds
    no second copy of torch (its private memory is a fraction of a started server's)."""
    (tmp_path / "forkprobe.py").write_text(PROBE)
    script = (
        "import atexit, json, os, sys; from pathlib import Path\n"
        "import torch\n"
        "from airgossip.emulation.fleets.agent_server import agent_environment\n"
        "from airgossip.emulation.fleets.forkserver import ForkServer\n"
        f"tmp = Path({str(tmp_path)!r})\n"
        "atexit.register(lambda: print('launcher exit handler', flush=True))\n"
        "def private(pid):\n"
        "    text = Path(f'/proc/{pid}/smaps_rollup').read_text().splitlines()\n"
        "    return sum(int(l.split()[1]) for l in text if l.startswith('Private_')) // 1024\n"
        "sizes = {}\n"
        "for here in (True, False):\n"
        "    s = ForkServer(['torch', 'numpy'], env=agent_environment(), cwd=Path('.'),\n"
        "                   log_path=tmp / f's-{here}.log', label=str(tmp), here=here)\n"
        "    kids = [s.spawn('forkprobe', [code, '--id', f'agent-{here}-{code}'],\n"
        "                    log_path=tmp / f'c-{here}-{code}.log', cwd=tmp)\n"
        "            for code in ('3', '0')]\n"
        "    codes = [k.wait(60) for k in kids]\n"
        "    sizes[str(here)] = private(s.pid)\n"
        "    s.close()\n"
        "    assert s.process.poll() is not None\n"
        "    print(json.dumps({'codes': codes, 'pid': s.pid}), flush=True)\n"
        "print(json.dumps(sizes), flush=True)\n"
    )
    launcher = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"},
    )  # fmt: skip
    assert launcher.returncode == 0, launcher.stderr[-3000:]
    lines = launcher.stdout.splitlines()
    assert len(lines) == 4 and lines[3] == "launcher exit handler", lines
    assert json.loads(lines[0])["codes"] == json.loads(lines[1])["codes"] == [3, 0], lines
    # The launcher's exit handler is the launcher's: not run by the server or a child.
    for log in tmp_path.glob("[sc]-True*.log"):
        assert "launcher exit handler" not in log.read_text(), log
    forked = [reported(tmp_path / f"c-True-{code}.log") for code in ("3", "0")]
    server_pid = json.loads(lines[0])["pid"]
    for child in forked:
        assert child["ppid"] == server_pid and child["sid"] == child["pid"]
        assert child["fds"][:3] == [0, 1, 2] and len(child["fds"]) <= 4, child["fds"]
        assert child["sigterm"] and child["sigint"] and child["omp"] == "1"
        assert str(child["comm"]).startswith("agent-True")
    for key in ("random", "numpy", "torch"):
        assert forked[0][key] != forked[1][key], key
    assert "imported" in (tmp_path / "s-True.log").read_text()
    sizes = json.loads(lines[2])
    # A started server imports torch itself (about 140 MiB of its own); the forked one
    # shares the launcher's.
    assert sizes["True"] * 3 < sizes["False"], sizes
