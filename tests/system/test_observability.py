"""A real Prometheus discovers a running fleet through the coordinator's service discovery."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, LocalFleet, free_port, promtool_check

pytestmark = pytest.mark.slow

AGENTS = 4


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[LocalFleet]:
    fleet = LocalFleet(tmp_path, agents=AGENTS, topology=["--topology", "exponential"])
    try:
        fleet.start_coordinator()
        for i in range(AGENTS):
            fleet.start_agent(i)
        yield fleet
    finally:
        fleet.close()


class Prometheus:
    """Debian's Prometheus with its own config and storage, on a loopback port."""

    def __init__(self, tmp: Path, coordinator_metrics: str) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: `./scripts/install --dev` installs Debian's package"
        self.port = free_port()
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "scrape_configs:\n"
            "  - job_name: airgossip-coordinator\n"
            "    static_configs:\n"
            f"      - targets: ['{coordinator_metrics}']\n"
            "  - job_name: airgossip-agents\n"
            "    http_sd_configs:\n"
            f"      - url: http://{coordinator_metrics}/sd\n"
            "        refresh_interval: 1s\n"
        )
        self.log = tmp / "prometheus.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"http://127.0.0.1:{self.port}{path}{query}"
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.loads(reply.read())

    def query(self, promql: str) -> list[dict[str, Any]]:
        answer = self.get("/api/v1/query", query=promql)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                return True
        except OSError:
            assert self.process.poll() is None, self.log.read_text()
            return False

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


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
    prometheus = Prometheus(tmp_path, coordinator)
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
    finally:
        prometheus.close()


def test_a_launched_fleet_exposes_service_discovery(tmp_path: Path) -> None:
    port = free_port()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "airgossip", "run", "--task", "consensus", "--agents", "3",
         "--rounds", "1000000", "--metrics-port", str(port), "--out", str(tmp_path / "run")],
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
        for group in groups:
            promtool_check(scrape(f"http://{group['targets'][0]}/metrics"))
    finally:
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 130
