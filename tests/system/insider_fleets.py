"""Fleets watched by a real Prometheus evaluating the shipped insider rules
(``deploy/prometheus/alerts.yml``), in lock step or free-running, with or without a forger.

Each fleet is eight consensus agents in this process, each serving real gRPC with mutual TLS (the
test CA's certificates) and its own ``/metrics`` over real HTTP. A *lock-step* fleet's rounds are
driven by its caller; a *free-running* fleet's agents each run their own
:class:`~airgossip.edge.agent.runner.WallClockRunner` on a thread, as an agent process does (they
wait for in-neighbours at most ``wait_timeout_s`` and never more than ``staleness`` rounds apart;
nothing paces them), and every link drops messages at the fleet's ``loss``.

The forger is issue 17's: agent-0, with its genuine key, replaces its pushes with forged
ones (y = 1000, x = 1000 * y on every element, numbered from the acknowledgements it gets).
The drifter is issue 33's: agent-0, with its genuine key and its own algorithm's sequence
numbers, sends each out-neighbour the receiver's own estimate plus 0.1 of its norm in one
fixed direction (``slow-drift`` of :mod:`airgossip.emulation.attacks`), from when it is told on.

``tests/system/test_insider_alert.py`` runs short checks on these fleets; the long
measurements of docs/security.md ("Detecting an insider") run them from here::

    python -m tests.system.insider_fleets honest --algorithm clipped-gossip --minutes 2
    python -m tests.system.insider_fleets forger --runs 3
    python -m tests.system.insider_fleets drifter --algorithm robust-push-sum --runs 3
    python -m tests.system.insider_fleets honest --agents 16 --minutes 30 --algorithm ALGORITHM

Each prints one JSON line per fleet: rounds, rounds a second, alerts fired by name and peer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from airgossip.common.http import MetricsServer
from airgossip.common.security.tls import fleet_of
from airgossip.common.topology import assignments_for_graph, build_graph
from airgossip.common.topology.graphs import Graph
from airgossip.edge.agent import Agent, build_agent
from airgossip.edge.agent.runner import WallClockRunner
from airgossip.edge.algorithms import algorithm_class
from airgossip.edge.observability.metrics import AgentMetrics
from airgossip.edge.settings import AgentSettings, TaskSettings
from airgossip.edge.transport import GossipMessage
from airgossip.edge.transport.base import MessageHeader, SendCallback, SendOutcome, Transport
from airgossip.edge.transport.grpc_transport import GrpcTransport
from airgossip.emulation.attacks import Insiders, arm
from airgossip.emulation.networks.static import BernoulliLinkShaper, LinkSpec
from tests.support.cli import ROOT
from tests.support.processes import free_port
from tests.support.prometheus import Prometheus
from tests.support.tls import credentials

AGENTS = 8
INSIDER = "agent-0"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
#: The algorithms of issue 33's honest runs; the clipped ones need an undirected graph.
ALGORITHMS = ("push-sum", "robust-push-sum", "clipped-gossip", "cs-plus-gossip")
UNDIRECTED = {"clipped-gossip", "cs-plus-gossip"}


def fleet_graph(algorithm: str, agents: int = AGENTS) -> Graph:
    """The directed exponential graph (three in-neighbours each of eight, four of sixteen),
    or for algorithms that need an undirected graph the circulant with offsets +-1, +-2 (four
    neighbours each: cs-plus-gossip with ``byzantine`` 1 lets no agent of degree 3 or less
    mix)."""
    if algorithm not in UNDIRECTED:
        return build_graph("exponential", agents)
    edges = [(i, (i + d) % agents) for i in range(agents) for d in (1, 2, -1, -2)]
    return build_graph("edges", agents, edges=edges)


class Forger:
    """agent-0's transport, turned: passes genuine pushes through until :attr:`forging`, then
    sends forged ones in their place, numbered from the latest acknowledgement of each edge."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.forging = False
        self.forged = 0
        self.acked: dict[str, int] = {}
        self.headers: dict[str, MessageHeader] = {}  # the latest sent to each peer
        self._lock = threading.Lock()

    def start(self, handler: Any) -> str:
        return self.inner.start(handler)

    def send(self, peer: str, address: str, message: GossipMessage, done: SendCallback) -> None:
        if self.forging:
            header = message.header
            assert header.codec == "float64", header.codec
            with self._lock:
                last = self.acked.get(peer, 0)
                self.forged += 1
            forged = dataclasses.replace(header, seq=last + 1, base_seq=last, scalars={"y": 1000.0})
            data = torch.full((header.numel,), 1000.0 * 1000.0, dtype=torch.float64)
            message = GossipMessage(forged, data.numpy().tobytes())
        self.headers[peer] = message.header

        def acknowledged(outcome: SendOutcome) -> None:
            if outcome.ack is not None:
                with self._lock:
                    self.acked[peer] = max(self.acked.get(peer, 0), outcome.ack.last_seq)
            done(outcome)

        self.inner.send(peer, address, message, acknowledged)

    def close(self) -> None:
        self.inner.close()


class WatchedFleet:
    """Eight consensus agents on mutual TLS, each with its metrics served over HTTP.

    Parameters
    ----------
    name:
        The fleet's Prometheus job.
    insider:
        agent-0's transport is a :class:`Forger` (not forging until told).
    drifter:
        agent-0 is a slow drifter once :meth:`start_drifting` is called.
    algorithm:
        Every agent's algorithm (its defaults: ``byzantine`` 1 for the robust ones).
    loss:
        Probability that a link drops a message (free-running fleets; seeded).
    rounds:
        The run's length.
    agents:
        How many agents (eight unless told).
    """

    def __init__(
        self,
        name: str,
        *,
        insider: bool,
        algorithm: str = "push-sum",
        loss: float = 0.0,
        rounds: int = 1000,
        drifter: bool = False,
        agents: int = AGENTS,
    ) -> None:
        self.name = name
        self.algorithm = algorithm
        self.drifter = drifter
        self.drifting = False
        self.size = agents
        settings = AgentSettings(
            task=TaskSettings(name="consensus", dim=8), algorithm=algorithm, rounds=rounds,
            wait_timeout_s=0.5, seed=3, eval_every=10,
        )  # fmt: skip
        shaper = BernoulliLinkShaper(LinkSpec(loss=loss), seed=3) if loss else None
        self.agents: list[Agent] = []
        self.servers: list[MetricsServer] = []
        self.threads: list[threading.Thread] = []
        self.forger: Forger | None = None
        self.failures: list[BaseException] = []
        for i in range(agents):
            agent_id = f"agent-{i}"
            security = credentials(agent_id)
            transport: Transport = GrpcTransport(agent_id, security=security, shaper=shaper)
            if insider and agent_id == INSIDER:
                transport = self.forger = Forger(transport)
            metrics = AgentMetrics(agent_id)
            self.agents.append(
                build_agent(agent_id, index=i, num_agents=agents, settings=settings,
                            transport=transport, fleet=fleet_of(security), observer=metrics)
            )  # fmt: skip
            server = MetricsServer(metrics.registry, "127.0.0.1:0")
            server.start()
            self.servers.append(server)
        addresses = {a.agent_id: a.start() for a in self.agents}
        scheme = algorithm_class(algorithm).mixing
        self.graph = fleet_graph(algorithm, agents)
        assignments = assignments_for_graph(self.graph, addresses, scheme=scheme)
        for agent in self.agents:
            agent.set_assignment(assignments[agent.agent_id])

    def start_drifting(self) -> None:
        """agent-0 starts its slow drift: from its next push on, each out-neighbour gets its
        own estimate plus 0.1 of its norm in one fixed direction (read from the receivers'
        state, as :mod:`airgossip.emulation.attacks` does)."""
        assert self.drifter and not self.drifting
        arm(Insiders("slow-drift", (0,)), self.graph)(self.agents)
        self.drifting = True

    def scrape_config(self) -> str:
        targets = "".join(
            f"      - targets: ['{server.address}']\n"
            f"        labels: {{agent: {agent.agent_id}, fleet: {self.name}}}\n"
            for agent, server in zip(self.agents, self.servers, strict=True)
        )
        return f"  - job_name: {self.name}\n    static_configs:\n{targets}"

    # -- lock step -----------------------------------------------------------------------------
    def push(self, round_index: int) -> None:
        for agent in self.agents:
            agent.local_step(round_index)
            agent.push(round_index)

    def settled(self) -> bool:
        return all(not agent.outbox.inflight for agent in self.agents)

    def mix(self, round_index: int) -> None:
        for agent in self.agents:
            agent.mix(round_index)

    # -- free-running --------------------------------------------------------------------------
    def run_free(self) -> None:
        """Start every agent's own wall-clock runner on a thread."""
        for agent in self.agents:
            thread = threading.Thread(target=self._run, args=(agent,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _run(self, agent: Agent) -> None:
        try:
            WallClockRunner(agent).run()
        except BaseException as error:  # reported by the caller, never lost on a thread
            self.failures.append(error)
            raise

    def round(self) -> float:
        """The median round of the fleet's agents."""
        rounds = sorted(agent.round for agent in self.agents)
        return (rounds[self.size // 2 - 1] + rounds[self.size // 2]) / 2

    # ------------------------------------------------------------------------------------------
    def spread(self) -> float:
        """Largest element of any agent's estimate, in magnitude."""
        return max(float(a.algorithm.estimate().abs().max()) for a in self.agents)

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()
        for thread in self.threads:
            thread.join(timeout=10)
        for agent in self.agents:
            agent.close()
        for server in self.servers:
            server.stop()


class PacedPrometheus(Prometheus):
    """:class:`~tests.support.prometheus.Prometheus` scraping and evaluating every
    ``interval_s`` seconds (the stack ships 5 s; the tests use 1 s)."""

    def __init__(
        self,
        tmp: Path,
        scrape_configs: str,
        *,
        rules: Sequence[Path],
        interval_s: float = 1.0,
    ) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: `./scripts/install --dev` installs Debian's package"
        self.port = free_port()
        config = tmp / "prometheus.yml"
        every = f"{interval_s:g}s"
        config.write_text(
            f"global:\n  scrape_interval: {every}\n  scrape_timeout: 1s\n"
            f"  evaluation_interval: {every}\n"
            f"rule_files: {json.dumps([str(r) for r in rules])}\nscrape_configs:\n{scrape_configs}"
        )
        self.log = tmp / "prometheus.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip


@contextmanager
def watching(
    fleets: Sequence[WatchedFleet],
    tmp: Path,
    *,
    interval_s: float = 1.0,
    extra_rules: Sequence[Path] = (),
) -> Iterator[Prometheus]:
    """A Prometheus evaluating a copy of the shipped rules (and ``extra_rules``, candidates
    measured beside them) on ``fleets``, every one of their agents scraped and up."""
    rules = tmp / "alerts.yml"
    shutil.copy(RULES, rules)
    scrape = "".join(fleet.scrape_config() for fleet in fleets)
    prometheus = PacedPrometheus(tmp, scrape, rules=[rules, *extra_rules], interval_s=interval_s)
    try:
        deadline = time.monotonic() + 30
        while not prometheus.ready():
            assert time.monotonic() < deadline, prometheus.log.read_text()
            time.sleep(0.1)
        while len(prometheus.query("up == 1")) < sum(fleet.size for fleet in fleets):
            assert time.monotonic() < deadline, prometheus.get("/api/v1/targets")
            time.sleep(0.2)
        yield prometheus
    finally:
        prometheus.close()


def firing(prometheus: Prometheus) -> list[dict[str, str]]:
    """Labels of every firing alert."""
    alerts = prometheus.get("/api/v1/alerts")["data"]["alerts"]
    return [a["labels"] for a in alerts if a["state"] == "firing"]


def named(alert: dict[str, str]) -> tuple[str, str, str, str]:
    """``(job, alertname, accuser, peer)`` of a firing alert (accuser ``-`` where none)."""
    return (alert["job"], alert["alertname"], alert.get("agent", "-"), alert["peer"])


def honest_named(
    seen: Iterable[tuple[str, str, str, str]],
) -> set[tuple[str, str, str, str]]:
    """The alerts of ``seen`` that name an honest peer on an honest agent's word: any alert
    of a fleet without insider, and in the attacked fleet any that names someone other than
    the insider, but for the insider's own accusations (its /metrics are its to write)."""
    return {a for a in seen if a[3] != INSIDER and (a[0] != "attacked" or a[2] != INSIDER)}


@dataclasses.dataclass
class Naming:
    """How long a free-running fleet took to name its forger: ``seconds`` and ``rounds`` (the
    fleet's median round) from the first forged push; ``seen``: every alert that fired, with
    the seconds from the first forged push at which it was first seen (negative: before)."""

    rounds_per_s: float
    seconds: float | None
    rounds: float | None
    forged: int
    seen: dict[tuple[str, str, str, str], float]


def warm_up(fleets: Sequence[WatchedFleet], seconds: float) -> None:
    """Let free-running fleets run (their failures raised)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.25)
        for fleet in fleets:
            assert not fleet.failures, fleet.failures


def name_the_forger(
    attacked: WatchedFleet,
    prometheus: Prometheus,
    *,
    others: Sequence[WatchedFleet] = (),
    warm_s: float = 8.0,
    limit_s: float = 30.0,
    after_s: float = 5.0,
    alert: str = "AirgossipSuspectedInsider",
) -> Naming:
    """Free-running: warm up ``warm_s``, start forging (or drifting, for a fleet with a
    drifter), poll Prometheus's alerts every 0.2 s until ``alert`` names the insider (at most
    ``limit_s``), then watch ``after_s`` more for anything else that fires."""
    assert attacked.forger is not None or attacked.drifter
    fleets = [attacked, *others]
    warm_up(fleets, warm_s)
    seen = {named(a): -1.0 for a in firing(prometheus)}
    began, round0 = time.monotonic(), attacked.round()
    if attacked.forger is not None:
        attacked.forger.forging = True
    else:
        attacked.start_drifting()
    seconds = rounds = None
    stop = began + limit_s
    while time.monotonic() < stop:
        time.sleep(0.2)
        alerts = [named(a) for a in firing(prometheus)]
        now = time.monotonic() - began
        for fired in alerts:
            seen.setdefault(fired, round(now, 1))
        if seconds is None and (attacked.name, alert, "-", INSIDER) in alerts:
            seconds, rounds = now, attacked.round() - round0
            stop = min(stop, time.monotonic() + after_s)
        for fleet in fleets:
            assert not fleet.failures, fleet.failures
    pace = (attacked.round() - round0) / (time.monotonic() - began)
    forged = attacked.forger.forged if attacked.forger is not None else 0
    return Naming(pace, seconds, rounds, forged, seen)


def watch_honest(
    fleets: Sequence[WatchedFleet], prometheus: Prometheus, seconds: float
) -> dict[str, Any]:
    """Free-running honest fleets for ``seconds``: every alert that fired (polled each second),
    and how fast they ran."""
    began = time.monotonic()
    start = {fleet.name: fleet.round() for fleet in fleets}
    seen: set[tuple[str, str, str, str]] = set()
    while time.monotonic() < began + seconds:
        time.sleep(1.0)
        seen.update(named(a) for a in firing(prometheus))
        for fleet in fleets:
            assert not fleet.failures, fleet.failures
    elapsed = time.monotonic() - began
    return {
        fleet.name: {
            "rounds": fleet.round() - start[fleet.name],
            "rounds_per_s": round((fleet.round() - start[fleet.name]) / elapsed, 2),
            "alerts": sorted(a for a in seen if a[0] == fleet.name),
        }
        for fleet in fleets
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["honest", "forger", "drifter"])
    parser.add_argument("--algorithm", action="append", choices=ALGORITHMS)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--loss", type=float, default=0.1)
    parser.add_argument("--after-s", type=float, default=20.0)
    parser.add_argument("--extra-rules", type=Path, action="append", default=[])
    parser.add_argument("--agents", type=int, default=AGENTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="insider-fleets-") as folder:
        for run in range(args.runs):
            tmp = Path(folder) / f"run-{run}"
            tmp.mkdir()
            if args.what == "honest":
                algorithms = args.algorithm or list(ALGORITHMS)
                fleets = [
                    WatchedFleet(
                        a,
                        insider=False,
                        algorithm=a,
                        loss=args.loss,
                        rounds=10_000_000,
                        agents=args.agents,
                    )
                    for a in algorithms
                ]
                try:
                    with watching(
                        fleets, tmp, interval_s=args.interval_s, extra_rules=args.extra_rules
                    ) as prometheus:
                        for fleet in fleets:
                            fleet.run_free()
                        result = watch_honest(fleets, prometheus, 60 * args.minutes)
                finally:
                    for fleet in fleets:
                        fleet.close()
                print(json.dumps({"minutes": args.minutes, "interval_s": args.interval_s,
                                  "loss": args.loss, "fleets": result}), flush=True)  # fmt: skip
            else:
                drift = args.what == "drifter"
                attacked = WatchedFleet(
                    "attacked", insider=not drift, drifter=drift, loss=args.loss,
                    rounds=10_000_000, agents=args.agents,
                    algorithm=(args.algorithm or ["robust-push-sum" if drift else "push-sum"])[0],
                )  # fmt: skip
                try:
                    with watching(
                        [attacked], tmp, interval_s=args.interval_s, extra_rules=args.extra_rules
                    ) as prometheus:
                        attacked.run_free()
                        naming = name_the_forger(
                            attacked, prometheus, limit_s=60, after_s=args.after_s,
                            alert="AirgossipDriftingInsider" if drift else
                            "AirgossipSuspectedInsider",
                        )  # fmt: skip
                finally:
                    attacked.close()
                print(json.dumps({"what": args.what, "algorithm": attacked.algorithm,
                                  "agents": args.agents,
                                  "interval_s": args.interval_s, "loss": args.loss,
                                  "rounds_per_s": round(naming.rounds_per_s, 2),
                                  "named_after_s": naming.seconds, "named_after_rounds":
                                  naming.rounds, "forged": naming.forged,
                                  "alerts": sorted(naming.seen.items()),
                                  "honest_named": sorted(honest_named(naming.seen))}),
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
