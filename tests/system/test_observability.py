"""A real Prometheus discovers a running fleet through the coordinator's service discovery,
plain and behind TLS and basic auth; metrics endpoints stay answered under idle connections."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import local_fleet
from tests.support.cli import ROOT
from tests.support.local_fleet import LocalFleet
from tests.support.processes import free_port
from tests.support.prometheus import Prometheus, fleet_scrape_configs, promtool_check
from tests.support.tls import credentials_folder

pytestmark = pytest.mark.slow

AGENTS = 4
#: Every agent of a device class that draws power (on devices: its real step times, and
#: airtime at the class's nominal rate: the links model none).
DEVICES = """
[[device_classes]]
name = "phone"
fraction = 1.0
compute_w = 3.0
tx_w = 1.2
rx_w = 0.8
radio_mbps = 20
battery_j = 1e6
"""


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[LocalFleet]:
    fleet = LocalFleet(
        tmp_path, agents=AGENTS, topology=["--topology", "exponential"],
        scenario=local_fleet.SCENARIO.format(agents=AGENTS) + DEVICES,
    )  # fmt: skip
    try:
        fleet.start_coordinator()
        for i in range(AGENTS):
            fleet.start_agent(i)
        yield fleet
    finally:
        fleet.close()


def panel_query(dashboard: str, title: str) -> str:
    """The query of ``dashboard``'s panel ``title``, its variables matching everything."""
    data = json.loads((ROOT / "deploy/grafana/dashboards" / dashboard).read_text())
    (panel,) = [p for p in data["panels"] if p["title"] == title]
    expr: str = panel["targets"][0]["expr"]
    for name, value in {"$__rate_interval": "20s", "$agent": ".*", "$peer": ".*"}.items():
        expr = expr.replace(name, value)
    return expr


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text: str = reply.read().decode()
        return text


def test_prometheus_discovers_the_fleet_and_answers_promql(
    fleet: LocalFleet, tmp_path: Path
) -> None:
    fleet.wait(
        lambda: all(fleet.round_of(i) >= 4 for i in range(AGENTS)), 240, "every agent to train"
    )
    coordinator = f"127.0.0.1:{fleet.metrics_port}"
    prometheus = Prometheus(tmp_path, fleet_scrape_configs(coordinator))
    try:
        fleet.wait(prometheus.ready, 60, "Prometheus to be ready")

        def agent_targets() -> list[dict[str, Any]]:
            active = prometheus.get("/api/v1/targets")["data"]["activeTargets"]
            return [
                t for t in active
                if t["labels"]["job"] == "airgossip-agents" and t["health"] == "up"
            ]  # fmt: skip

        targets = fleet.wait(lambda: len(agent_targets()) == AGENTS and agent_targets(), 60,
                             "Prometheus to discover and scrape every agent")  # fmt: skip
        assert sorted(t["labels"]["agent"] for t in targets) == [
            f"agent-{i}" for i in range(AGENTS)
        ]
        sd = json.loads(scrape(f"http://{coordinator}/sd"))
        assert sorted(t["scrapeUrl"] for t in targets) == sorted(
            f"http://{group['targets'][0]}/metrics" for group in sd
        )

        # Every endpoint passes promtool's checks, with no *_created series.
        for url in [f"http://{coordinator}/metrics", *(t["scrapeUrl"] for t in targets)]:
            text = scrape(url)
            promtool_check(text)
            assert "_created" not in text, url

        # Rates need two scrapes inside the window.
        time.sleep(4)
        alive = prometheus.query("airgossip_fleet_agents_alive")
        assert [float(r["value"][1]) for r in alive] == [AGENTS]

        accuracy = fleet.wait(
            lambda: len(r := prometheus.query("airgossip_agent_accuracy_ratio")) == AGENTS and r,
            30, "accuracy of every agent",
        )  # fmt: skip
        assert sorted(r["metric"]["agent"] for r in accuracy) == [
            f"agent-{i}" for i in range(AGENTS)
        ]
        assert all(0.1 < float(r["value"][1]) <= 1.0 for r in accuracy), accuracy
        reported = prometheus.query("airgossip_fleet_agent_accuracy_ratio")
        assert len(reported) == AGENTS

        edges = {tuple(e) for phase in fleet.fleet()["edges"] for e in phase}
        per_link = fleet.wait(
            lambda: len(r := prometheus.query("rate(airgossip_agent_sent_bytes_total[5s])"))
            == len(edges) and r,
            30, "bytes/s on every link",
        )  # fmt: skip
        assert {(r["metric"]["agent"], r["metric"]["peer"]) for r in per_link} == edges
        assert all(float(r["value"][1]) > 0 for r in per_link), per_link
        seen_by_coordinator = prometheus.query(
            "sum by (agent, peer) (rate(airgossip_fleet_link_sent_bytes_total[5s]))"
        )
        assert {(r["metric"]["agent"], r["metric"]["peer"]) for r in seen_by_coordinator} == edges
        latency = prometheus.query(
            "histogram_quantile(0.9, sum by (le) (rate(airgossip_agent_push_latency_seconds_bucket[5s])))"  # noqa: E501
        )
        assert len(latency) == 1 and 0 < float(latency[0]["value"][1]) < 30
        # Every agent measures what each in-neighbour's messages do to it (received edges).
        increments = prometheus.query("airgossip_agent_in_neighbour_increment_ratio_count")
        assert {(r["metric"]["peer"], r["metric"]["agent"]) for r in increments} == edges
        # The fleet dashboard's energy panels draw from it: joules by agent, compute and radio.
        for title in ("Energy spent per agent", "Battery left per agent"):
            expr = panel_query("airgossip-fleet.json", title)
            drawn = prometheus.query(expr)
            assert sorted(r["metric"]["agent"] for r in drawn) == [
                f"agent-{i}" for i in range(AGENTS)
            ], (title, drawn)
            assert all(0 < float(r["value"][1]) < 1e6 for r in drawn), (title, drawn)
        for kind in ("compute", "radio"):
            spent = prometheus.query(f'airgossip_agent_energy_joules{{kind="{kind}"}}')
            assert len(spent) == AGENTS and all(float(r["value"][1]) > 0 for r in spent)
    finally:
        prometheus.close()


@pytest.mark.parametrize(
    ("links", "exported"),
    [
        ([], "airgossip_agent_messages_sent_total{"),
        # Office Wi-Fi: 3 agents in one room are in range, so every agent exports the radio
        # gauges of its out-links (in a 2 km lte-urban square, 3 agents hear nobody).
        (["--scenario", "wifi-indoor"], "airgossip_link_rate_bytes_per_second{"),
    ],
    ids=["static", "wireless"],
)
def test_a_launched_fleet_exposes_service_discovery_and_metrics_promtool_accepts(
    tmp_path: Path, links: list[str], exported: str
) -> None:
    port = free_port()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "airgossip", "run", "--task", "consensus", "--agents", "3",
         "--rounds", "1000000", "--metrics-port", str(port), "--out", str(tmp_path / "run"),
         *links],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        groups: list[dict[str, Any]] = []
        while time.monotonic() < deadline and len(groups) < 3:
            assert launcher.poll() is None, launcher.communicate()[1]
            with contextlib.suppress(OSError):  # not serving yet
                groups = json.loads(scrape(f"http://127.0.0.1:{port}/sd"))
            time.sleep(0.5)
        assert sorted(g["labels"]["agent"] for g in groups) == ["agent-0", "agent-1", "agent-2"]
        ports = {int(g["targets"][0].rsplit(":", 1)[1]) for g in groups}
        assert len(ports) == 3 and port not in ports  # every agent picked its own free port
        agents = [f"http://{group['targets'][0]}/metrics" for group in groups]
        # Lint what a running fleet exports: every agent has pushed (per-peer series) and, on
        # radio links, exported its links' radio state.
        while not all(exported in scrape(url) for url in agents):
            assert time.monotonic() < deadline, [scrape(url) for url in agents]
            assert launcher.poll() is None, launcher.communicate()[1]
            time.sleep(0.5)
        for url in [f"http://127.0.0.1:{port}/metrics", *agents]:
            promtool_check(scrape(url))
    finally:
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 130


SCENARIO = """\
agents = 2
rounds = 1000000
wait_timeout_s = 0.25
[task]
name = "consensus"
"""
IDLE = 200


def guarded_scrape(address: str, path: str, ca: Path, server_name: str, auth: str | None) -> bytes:
    """GET over TLS, the fleet's CA checking ``server_name``, with basic auth ``user:pass``."""
    context = ssl.create_default_context(cafile=str(ca))
    host, port = address.rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        token = base64.b64encode(auth.encode()).decode() if auth else ""
        header = f"Authorization: Basic {token}\r\n" if auth else ""
        tls.sendall(f"GET {path} HTTP/1.0\r\n{header}\r\n".encode())
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    return answer


def test_prometheus_scrapes_a_fleet_behind_tls_and_basic_auth_while_idle_connections_pile_up(
    tmp_path: Path,
) -> None:
    certs = credentials_folder()
    password = tmp_path / "metrics-password"
    password.write_text("correct horse battery staple\n")
    guard = ["--certs", str(certs), "--metrics-tls", "--metrics-user", "prometheus",
             "--metrics-password-file", str(password)]  # fmt: skip
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    grpc_port, metrics_port = free_port(), free_port()
    coordinator = f"127.0.0.1:{metrics_port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    spawned = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def spawn(name: str, *args: str) -> None:
        with (logs / f"{name}.log").open("wb") as log:
            spawned.append(subprocess.Popen(
                [sys.executable, "-m", "airgossip", *args], cwd=ROOT, env=env,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            ))  # fmt: skip

    spawn("coordinator", "coordinator", "--listen", f"127.0.0.1:{grpc_port}", "--metrics-port",
          str(metrics_port), "--config", str(scenario), "--topology", "ring", *guard)  # fmt: skip
    for i in range(2):
        spawn(f"agent-{i}", "agent", "--coordinator", f"127.0.0.1:{grpc_port}", "--index",
              str(i), "--threads", "1", "--parent-pid", str(os.getpid()), *guard)  # fmt: skip
    ca = certs / "ca.pem"

    def access(name: str, indent: str) -> str:
        """tls_config (the fleet's CA, ``name`` checked) and basic_auth, as YAML."""
        lines = ["tls_config:", f"  ca_file: {ca}", f"  server_name: {name}", "basic_auth:",
                 "  username: prometheus", f"  password_file: {password}"]  # fmt: skip
        return "".join(f"{indent}{line}\n" for line in lines)

    prometheus = Prometheus(
        tmp_path,
        "  - job_name: airgossip-coordinator\n    scheme: https\n"
        + access("coordinator", "    ")
        + f"    static_configs:\n      - targets: ['{coordinator}']\n"
        "  - job_name: airgossip-agents\n    scheme: https\n"
        + access("airgossip-metrics", "    ")
        + f"    http_sd_configs:\n      - url: https://{coordinator}/sd\n"
        "        refresh_interval: 1s\n" + access("coordinator", "        "),
    )  # fmt: skip
    idle: list[socket.socket] = []
    try:

        def healthy() -> list[dict[str, Any]]:
            assert all(p.poll() is None for p in spawned), (logs / "coordinator.log").read_text()
            active = prometheus.get("/api/v1/targets")["data"]["activeTargets"]
            return [t for t in active if t["health"] == "up"]

        deadline = time.monotonic() + 180
        while not prometheus.ready():
            assert time.monotonic() < deadline, prometheus.log.read_text()
            time.sleep(0.2)
        while len(up := healthy()) < 3:
            assert time.monotonic() < deadline, prometheus.get("/api/v1/targets")
            time.sleep(0.5)
        assert sorted(t["labels"].get("agent", "-") for t in up) == ["-", "agent-0", "agent-1"]
        assert all(t["scrapeUrl"].startswith("https://") for t in up)
        agent = next(t["labels"]["instance"] for t in up if t["labels"].get("agent"))
        rounds = prometheus.query("airgossip_agent_round")
        assert sorted(r["metric"]["agent"] for r in rounds) == ["agent-0", "agent-1"]
        # Without the password, or without TLS, nothing is served.
        refused = guarded_scrape(coordinator, "/metrics", ca, "coordinator", None)
        assert refused.startswith(b"HTTP/1.1 401")
        with pytest.raises((OSError, urllib.error.URLError)):
            scrape(f"http://{coordinator}/metrics")

        # 200 connections that never send a byte, to the coordinator and to an agent.
        for address in (coordinator, agent):
            host, port = address.rsplit(":", 1)
            idle += [socket.create_connection((host, int(port)), timeout=5) for _ in range(IDLE)]
        for address, name in ((coordinator, "coordinator"), (agent, "airgossip-metrics")):
            for _ in range(3):
                started = time.monotonic()
                answer = guarded_scrape(address, "/metrics", ca, name, "prometheus:"
                                        "correct horse battery staple")  # fmt: skip
                took = time.monotonic() - started
                assert answer.startswith(b"HTTP/1.1 200") and b"airgossip_" in answer
                assert took < 1.0, (address, took)
        time.sleep(3)  # three scrape intervals with the idle connections held
        assert len(healthy()) == 3
    finally:
        for sock in idle:
            sock.close()
        prometheus.close()
        for process in spawned:
            process.kill()
            process.wait(timeout=30)
