"""Prometheus's own tools on what the project exposes, and Debian's Prometheus itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.processes import free_port


def promtool_check(text: str) -> None:
    """`promtool check metrics` must accept the exposition without a single lint remark."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `./scripts/install --dev` installs Debian's prometheus"
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )


def fleet_scrape_configs(coordinator_metrics: str) -> str:
    """Scrape configs (YAML) of a plain fleet: the coordinator, and its agents found through
    the coordinator's service discovery."""
    return (
        "  - job_name: airgossip-coordinator\n"
        "    static_configs:\n"
        f"      - targets: ['{coordinator_metrics}']\n"
        "  - job_name: airgossip-agents\n"
        "    http_sd_configs:\n"
        f"      - url: http://{coordinator_metrics}/sd\n"
        "        refresh_interval: 1s\n"
    )


class Prometheus:
    """Debian's Prometheus with its own config and storage on a loopback port, scraping
    ``scrape_configs`` (YAML under ``scrape_configs:``) and evaluating ``rules`` every second."""

    def __init__(self, tmp: Path, scrape_configs: str, *, rules: Path | None = None) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: `./scripts/install --dev` installs Debian's package"
        self.port = free_port()
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            + (f"rule_files: ['{rules}']\n" if rules is not None else "")
            + f"scrape_configs:\n{scrape_configs}"
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
