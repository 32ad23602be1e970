"""How long ``--mode ray`` loses a node's agents for: Ray's default health checks beside tuned ones.

    python -m benchmarks --only ray-recovery
    python -m benchmarks.ray_recovery                       # the same, alone: one JSON object
    python -m benchmarks.ray_recovery --configs tuned --tuned-via env

The same scenario runs twice, each in a child process of its own with a cluster of its own:
once on a cluster whose head starts with Ray's default health checks (``default``), once with
``health_check_period_ms`` 500 and ``health_check_failure_threshold`` 3 (``tuned``), set as
docs/deployment.md says: the head's system config (``ray start --head --system-config``; here
``ray.cluster_utils.Cluster``'s ``_system_config``, what that flag sets) or, with
``--tuned-via env``, ``RAY_health_check_*`` in the environment the head starts in. Each
cluster is 3 nodes (the head and 2 workers, 2 logical CPUs each) on loopback, in a
temporary folder of its own (its sockets and logs; nothing else's Ray is touched). The
fleet: 6 agents learning digits, ``[ray] num_cpus`` 0.5 (one host actor of 2 agents per node:
the nodes left have room for the lost host), checkpoints every second, mutual TLS. Once every
agent trained round 10 (checkpointed), one worker node's raylet is killed with SIGKILL (the
node's other processes left to die as they do when a raylet goes). Measured from the kill:

- **declared dead**: when the GCS says the node is dead (``ray.nodes()``, asked every 0.1 s
  from the driver; the GCS log's first line about the node's loss is kept in the JSON, and
  Ray's own "marked dead" line is in the run's ``logs/ray.log``);
- **host restarted**: when the driver heard that the lost agents' host runs again on another
  node (the fleet's notice ``started again on node``);
- **registered again**: when the coordinator holds a new incarnation of every lost agent
  (forked again from its checkpoint by the restarted host, registered);
- **trained again**: when every lost agent's new incarnation reported its first round to the
  coordinator (its round records, read by the fleet every monitor pass: about twice a second
  on an idle machine, the resolution of these two figures);
- the run's final mean accuracy, the agents reporting and whether the run was complete.

The ratio is default / tuned. The load average is read before and after each run; on a busy
machine every figure above grows (the health checks are timers, the restarts are work).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.suite import Context, Outcome

#: The tuned health checks: a node silent for 3 checks 500 ms apart is dead (about 1.5 s).
TUNED = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
CONFIGS = ("default", "tuned")
AGENTS = 6
ROUNDS = 1500
KILL_ROUND = 10
NODES = 3
CPUS = 2
#: A child that runs past this is killed (its cluster with it).
CHILD_TIMEOUT_S = 900.0


class Watch:
    """What the fleet's progress says about the lost agents, from the kill to the end."""

    def __init__(self, victim_node: str, raylet: subprocess.Popen[bytes], kill_round: int) -> None:
        self.victim_node = victim_node
        self.raylet = raylet
        self.kill_round = kill_round
        self.launched = time.monotonic()
        self.fleet: Any = None
        self.killed_at: float | None = None
        self.dead_at: float | None = None
        self.restarted_at: float | None = None
        self.lost: list[str] = []
        #: Each lost agent's (round count, last round) at the kill.
        self.at_kill: dict[str, tuple[int, int]] = {}
        #: Each lost agent's incarnation (registrations) at the kill, and when the coordinator
        #: was first seen to hold a newer one (the agent forked again on another node).
        self.incarnation: dict[str, int] = {}
        self.rejoined: dict[str, float] = {}
        #: Each lost agent's last new record of its old process (after the kill), and the
        #: first new record of its next one: (monotonic time, its round).
        self.last_before: dict[str, float] = {}
        self.first_after: dict[str, tuple[float, int]] = {}
        self._seen: dict[str, tuple[int, int]] = {}
        self.notices: list[tuple[float, str]] = []

    def on_start(self, fleet: Any) -> None:
        self.fleet = fleet

    def on_notice(self, text: str) -> None:
        now = time.monotonic()
        self.notices.append((now, text))
        if self.killed_at is not None and self.restarted_at is None and "started again" in text:
            self.restarted_at = now

    def on_progress(self, progress: Any) -> None:
        now = time.monotonic()
        fleet = self.fleet
        if fleet is None:
            return
        records = fleet.records()
        incarnations = {m.agent_id: m.incarnation for m in fleet.coordinator.view().members}
        if self.killed_at is None:
            if progress.slowest_round < self.kill_round or progress.registered < AGENTS:
                return
            self.lost = sorted(
                i for i, states in fleet.states.items()
                if states and states[-1].node_id == self.victim_node
            )  # fmt: skip
            for agent_id in self.lost:
                got = records.get(agent_id, [])
                self.at_kill[agent_id] = self._seen[agent_id] = (
                    len(got), got[-1].round if got else 0
                )  # fmt: skip
                self.incarnation[agent_id] = incarnations.get(agent_id, 1)
            self.raylet.send_signal(signal.SIGKILL)
            self.killed_at = time.monotonic()
            # Reaped at once, as init reaps an orphaned raylet on a real node: a zombie raylet
            # still "exists", and the node's workers (which exit when their raylet is gone)
            # would live on.
            self.raylet.wait(10)
            print(f"    raylet {self.raylet.pid} killed; its agents: {self.lost}", flush=True)
            return
        for agent_id in self.lost:
            newer = incarnations.get(agent_id, 1) > self.incarnation[agent_id]
            if newer and agent_id not in self.rejoined:
                self.rejoined[agent_id] = now
            got = records.get(agent_id, [])
            state = (len(got), got[-1].round if got else 0)
            if state == self._seen.get(agent_id):
                continue
            self._seen[agent_id] = state
            if not newer:
                self.last_before[agent_id] = now
            elif agent_id not in self.first_after:
                self.first_after[agent_id] = (now, state[1])

    def poll_nodes(self, stop: threading.Event) -> None:
        """Ask the GCS every 0.1 s, once the raylet is killed, whether the node is dead."""
        import ray

        while not stop.wait(0.1):
            if self.killed_at is None or self.dead_at is not None:
                continue
            try:
                nodes = ray.nodes()
            except Exception:  # a busy GCS: asked again
                continue
            if any(n["NodeID"] == self.victim_node and not n["Alive"] for n in nodes):
                self.dead_at = time.monotonic()
                print(
                    f"    node declared dead {self.dead_at - self.killed_at:.1f} s after the kill"
                )


def gcs_dead_line(session: Path, node_id: str) -> str | None:
    """The GCS log's first line about ``node_id``'s death (Ray's own words), if any."""
    log = session / "logs" / "gcs_server.out"
    if not log.exists():
        return None
    for line in log.read_text(errors="replace").splitlines():
        if node_id in line and re.search(r"dead|health check|failed", line, re.IGNORECASE):
            return line.strip()
    return None


def since(at: float | None, start: float | None) -> float | None:
    return None if at is None or start is None else round(at - start, 2)


def child(args: argparse.Namespace) -> None:
    """Start the cluster, run the fleet, kill the victim's raylet, write what was measured."""
    base = Path(args.base)
    homes = base / "h"
    # Ray writes the cluster's address into $TMPDIR/ray (ray_current_cluster).
    (homes / "ray").mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(homes)  # the hosts' private folders (keys) on each node
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only
    os.environ["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = "0"
    system_config: dict[str, int] = {}
    if args.config == "tuned":
        if args.tuned_via == "env":  # read by the GCS the head starts (and every node)
            for name, value in TUNED.items():
                os.environ[f"RAY_{name}"] = str(value)
        else:
            system_config = dict(TUNED)
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    from airgossip.emulation.fleets import run_fleet
    from airgossip.scenario.config import load_config

    ray_constants.ENABLE_RAY_CLUSTER = False
    node: dict[str, Any] = {
        "node_ip_address": "127.0.0.1", "num_cpus": args.cpus, "include_dashboard": False,
        "object_store_memory": 80 * 1024 * 1024, "temp_dir": str(base / "r"),
    }  # fmt: skip
    report: dict[str, Any] = {"config": args.config, "load_before": round(os.getloadavg()[0], 2)}
    cluster: Any = None
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={**node, "resources": {"node-0": 1}, "_system_config": system_config},
        )
        workers = [
            cluster.add_node(**node, resources={f"node-{i}": 1}) for i in range(1, args.nodes)
        ]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        victim = workers[-1]
        raylet = victim.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process
        watch = Watch(victim.node_id, raylet, args.kill_round)
        stop = threading.Event()
        poller = threading.Thread(target=watch.poll_nodes, args=(stop,), daemon=True)
        poller.start()
        settings = {
            "address": cluster.address, "placement": "spread", "num_cpus": 0.5,
            "checkpoint_interval_s": args.checkpoint_interval,
        }  # fmt: skip
        config = load_config(
            None, {"mode": "ray", "agents": args.agents, "rounds": args.rounds, "ray": settings}
        )
        out = Path(args.out)
        watch.launched = time.monotonic()
        try:
            results = run_fleet(
                config, out, on_progress=watch.on_progress, on_start=watch.on_start,
                on_notice=watch.on_notice,
            )  # fmt: skip
            final = results.final
            if final is not None:
                report.update(
                    mean_accuracy=final.mean_accuracy,
                    agents_reporting=final.agents_reporting,
                )
        except Exception as err:
            report["error"] = f"{type(err).__name__}: {err}"
        stop.set()
        poller.join(2)
        report["wall_s"] = round(time.monotonic() - watch.launched, 1)
        results_file = out / "results.json"
        if results_file.exists():
            report["complete"] = json.loads(results_file.read_text())["final"].get("complete")
        ray_file = out / "ray.json"
        if ray_file.exists():
            report["left_out"] = json.loads(ray_file.read_text()).get("left_out")
        killed = watch.killed_at
        trained = [t for t, _ in watch.first_after.values()]
        back = max(trained) if watch.lost and len(trained) == len(watch.lost) else None
        report.update(
            lost_agents=watch.lost,
            killed_at_s=since(killed, watch.launched),
            declared_dead_s=since(watch.dead_at, killed),
            host_restarted_s=since(watch.restarted_at, killed),
            registered_again_s=since(max(watch.rejoined.values(), default=None), killed),
            trained_again_s=since(back, killed),
            last_round_before_s={a: since(t, killed) for a, t in watch.last_before.items()},
            first_round_after={
                a: {"s": since(t, killed), "round": r} for a, (t, r) in watch.first_after.items()
            },
            rounds_at_kill={a: r for a, (_, r) in watch.at_kill.items()},
            last_rounds={
                a: [r.round for r in got[-1:]]
                for a, got in (watch.fleet.records() if watch.fleet else {}).items()
            },
            gcs_line=gcs_dead_line(base / "r" / "session_latest", victim.node_id),
            system_config={k: v for k, v in system_config.items() if k in TUNED},
            env={k: v for k, v in os.environ.items() if k.startswith("RAY_health_check")},
        )  # fmt: skip
    finally:
        report["load_after"] = round(os.getloadavg()[0], 2)
        Path(args.report).write_text(json.dumps(report, indent=2))
        try:
            ray.shutdown()
        finally:
            if cluster is not None:
                cluster.shutdown()


def leftovers(marker: str) -> list[int]:
    """Processes still running whose command line names ``marker`` (this run's folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


def measure(config: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run of the scenario with ``config``'s health checks, in a child process."""
    # Short: Ray's sockets live under it (a Unix socket's path is at most 107 bytes).
    base = Path(tempfile.mkdtemp(prefix=f"rr{config[0]}-", dir="/tmp"))
    report = out / f"{config}.json"
    report.unlink(missing_ok=True)
    shutil.rmtree(out / config, ignore_errors=True)  # a fleet's folder holds one run
    command = [
        sys.executable, "-m", "benchmarks.ray_recovery", "--child", "--config", config,
        "--tuned-via", args.tuned_via, "--agents", str(args.agents), "--rounds", str(args.rounds),
        "--kill-round", str(args.kill_round), "--nodes", str(args.nodes), "--cpus",
        str(args.cpus), "--checkpoint-interval", str(args.checkpoint_interval),
        "--base", str(base), "--out", str(out / config), "--report", str(report),
    ]  # fmt: skip
    process = subprocess.Popen(command, start_new_session=True)
    try:
        process.wait(CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    finally:
        # Whatever of this cluster outlived its child (a raylet's orphans): ended by pid.
        for _ in range(20):
            pids = leftovers(str(base))
            if not pids:
                break
            time.sleep(0.5)
        for pid in leftovers(str(base)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)
    got: dict[str, Any] = (
        json.loads(report.read_text()) if report.exists() else {"error": "no report"}
    )
    got["exit_code"] = process.returncode
    return got


def _s(value: object) -> str:
    return "never" if value is None else f"{value:.1f} s"


def table(figures: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| health checks | declared dead | host restarted | registered again | trained again "
        "| final mean accuracy | agents reporting | load average |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, got in figures.items():
        checks = "Ray's defaults" if name == "default" else "500 ms x 3"
        accuracy = got.get("mean_accuracy")
        rows.append(
            f"| {checks} | {_s(got.get('declared_dead_s'))} | {_s(got.get('host_restarted_s'))} "
            f"| {_s(got.get('registered_again_s'))} | {_s(got.get('trained_again_s'))} | "
            f"{'n/a' if accuracy is None else f'{accuracy:.3f}'} | "
            f"{got.get('agents_reporting')} of {AGENTS} | "
            f"{got.get('load_before')} -> {got.get('load_after')} |"
        )
    return "\n".join(rows)


def ratio(figures: dict[str, dict[str, Any]], key: str) -> str:
    default, tuned = figures.get("default", {}).get(key), figures.get("tuned", {}).get(key)
    return f"{default / tuned:.1f}x" if default and tuned else "n/a"


def measure_all(args: argparse.Namespace, out: Path) -> dict[str, dict[str, Any]]:
    figures: dict[str, dict[str, Any]] = {}
    for config in args.configs.split(","):
        print(f"  {config} health checks:", flush=True)
        figures[config] = got = measure(config, out, args)
        print(
            f"  {config}: declared dead {_s(got.get('declared_dead_s'))}, host restarted "
            f"{_s(got.get('host_restarted_s'))}, trained again {_s(got.get('trained_again_s'))}"
            f", accuracy {got.get('mean_accuracy')}, {got.get('agents_reporting')} reporting, "
            f"load {got.get('load_before')} -> {got.get('load_after')}"
            + (f", error {got['error']}" if "error" in got else ""),
            flush=True,
        )
    return figures


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.ray_recovery", description=__doc__.split("\n")[0]
    )
    p.add_argument("--configs", default=",".join(CONFIGS), help="default,tuned")
    p.add_argument(
        "--tuned-via", choices=("system-config", "env"), default="system-config",
        help="how the tuned checks reach the head: its system config or RAY_health_check_*",
    )  # fmt: skip
    p.add_argument("--agents", type=int, default=AGENTS)
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--kill-round", type=int, default=KILL_ROUND)
    p.add_argument("--nodes", type=int, default=NODES)
    p.add_argument("--cpus", type=int, default=CPUS, help="logical CPUs of each node")
    p.add_argument("--checkpoint-interval", type=float, default=1.0)
    p.add_argument("--out", default="runs/bench-ray-recovery")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", default="default", help=argparse.SUPPRESS)
    p.add_argument("--base", default="", help=argparse.SUPPRESS)
    p.add_argument("--report", default="", help=argparse.SUPPRESS)
    return p


def run(ctx: Context) -> list[Outcome]:
    from airgossip.emulation.fleets.ray_fleet import ray_available

    goal = (
        f"{AGENTS} agents on {NODES} nodes x {CPUS} CPUs (loopback), one worker's raylet "
        "SIGKILLed: time to the node declared dead and to its agents training again, Ray's "
        "default health checks beside 500 ms x 3; every agent reports at the end"
    )
    if not ray_available():
        return [
            Outcome(
                "ray-recovery", goal, "not measured", None,
                note="Ray is not installed (pip install 'airgossip[ray]')",
            )
        ]  # fmt: skip
    args = parser().parse_args([])
    figures = measure_all(args, ctx.work)
    default, tuned = figures["default"], figures["tuned"]
    met = all(
        f.get("trained_again_s") is not None and f.get("agents_reporting") == AGENTS
        for f in figures.values()
    )
    return [
        Outcome(
            "ray-recovery",
            goal,
            f"declared dead {_s(default.get('declared_dead_s'))} / "
            f"{_s(tuned.get('declared_dead_s'))} ({ratio(figures, 'declared_dead_s')}), trained "
            f"again {_s(default.get('trained_again_s'))} / {_s(tuned.get('trained_again_s'))} "
            f"({ratio(figures, 'trained_again_s')}), default / tuned",
            met,
            {**figures, "table": table(figures)},
            note="no speed target: the row says what the health checks cost",
        )
    ]


def main() -> None:
    args = parser().parse_args()
    if args.child:
        child(args)
        return
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    figures = measure_all(args, out)
    print(table(figures))
    if len(figures) == 2:
        print(
            f"ratio default / tuned: declared dead {ratio(figures, 'declared_dead_s')}, "
            f"trained again {ratio(figures, 'trained_again_s')}"
        )
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
