"""Compose files of a fleet: a coordinator, agents, Prometheus and Grafana.

:func:`compose_document` is the one description of the stack: the repository's top-level
``docker-compose.yml`` is its output for the bundled scenario (``deploy/compose/
scenario.toml``, the fleet size from ``AIRGOSSIP_AGENTS``), and ``airgossip compose`` writes
it for any fleet and scenario into a folder of its own, next to the scenario file.

* A one-shot ``certs`` service makes the fleet's certificate authority (its key in a volume
  only it mounts) and issues ``coordinator`` and ``agent-0`` .. ``agent-<N-1>`` into a named
  volume (existing ones are kept); everything else starts once it has succeeded and speaks
  mutual TLS.
* The coordinator reads the scenario and hands it to every agent, keeps its SQLite database
  on a named volume, serves ``/sd`` and writes the run's results there when it is complete;
  then it and the agents stay up, idle, serving their final state (``/metrics``) until the
  stack is brought down.
* Agents are replicas of one service; each claims an index in a shared volume (the image's
  entry point), takes its own certificate from the certificates volume, advertises its own
  address, keeps checkpoints on a volume (a restarted container resumes from them), and
  shapes its links in the kernel inside its own container (root with ``NET_ADMIN``; without
  it the agent shapes them itself).

The certificates volume is mounted read-only into every agent: one trust domain on one host
(an agent container could read another's key). A fleet of real devices gets a certificate
per device instead (``docs/deployment.md``).
* Prometheus reads ``deploy/prometheus/prometheus.yml`` (agents found through the
  coordinator's ``/sd``) and the alert rules beside it (``alerts.yml``); its image is
  ``deploy/docker/build``'s (Debian's binary) where no registry can be reached. Grafana,
  whose image only a registry has, starts with ``--profile grafana`` and gets its
  datasource and dashboards from ``deploy/grafana``.

Files are written in plain YAML by :func:`compose_yaml` (double-quoted strings, which any
YAML parser reads), so writing one needs nothing beyond the standard library.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import JsonValue

from airgossip.scenario.config import RunConfig

#: Images of the stack's services (variables let a site pick its own).
IMAGE = "${AIRGOSSIP_IMAGE:-airgossip:latest}"
#: Prometheus's image: ``deploy/docker/build`` makes it from Debian's Prometheus binary where
#: no registry can be reached; elsewhere compose builds it from Prometheus's own image.
PROMETHEUS_IMAGE = "${PROMETHEUS_IMAGE:-airgossip-prometheus:latest}"
PROMETHEUS_UPSTREAM = "${PROMETHEUS_UPSTREAM:-prom/prometheus:v2.53.0}"
GRAFANA_IMAGE = "${GRAFANA_IMAGE:-grafana/grafana:11.6.0}"
#: Grafana starts only with ``--profile grafana``: its image comes from a registry, and a
#: stack without one must come up without it.
GRAFANA_PROFILE = "grafana"
#: Where containers see the scenario file, the agents' claimed indices, the fleet's
#: certificates and the agents' checkpoints.
SCENARIO_IN_CONTAINER = "/etc/airgossip/scenario.toml"
CLAIMS = "/var/lib/airgossip/claims"
CERTS = "/var/lib/airgossip/certs"
AUTHORITY = "/var/lib/airgossip/ca"
CHECKPOINTS = "/var/lib/airgossip/checkpoints"
#: After the last round the coordinator and the agents keep serving their final state, idle,
#: until the stack is brought down (``--serve-until-stopped``): the fleet stays on the
#: dashboards, every Prometheus target up.
SERVE_UNTIL_STOPPED = "--serve-until-stopped"


def repository_root() -> Path | None:
    """The checkout this package runs from (it holds the Dockerfile and ``deploy/``)."""
    root = Path(__file__).resolve().parents[1]
    if (root / "Dockerfile").is_file() and (root / "deploy" / "prometheus").is_dir():
        return root
    return None


def trace_files(config: RunConfig) -> list[Path]:
    """The rate-trace files a wireless scenario reads (containers need them mounted)."""
    if config.wireless is None:
        return []
    return [trace.file for trace in config.wireless.traces]


def compose_document(
    *,
    agents: int | str,
    scenario: str,
    repository: str,
    traces: list[Path] | None = None,
) -> dict[str, JsonValue]:
    """The stack as a Compose-spec document.

    Parameters
    ----------
    agents:
        Fleet size: a number, or a variable such as ``${AIRGOSSIP_AGENTS:-4}``.
    scenario:
        The scenario file, relative to the compose file's folder.
    repository:
        The repository's root, relative to the compose file's folder (build context,
        Prometheus and Grafana files).
    traces:
        Absolute paths of trace files to mount where the scenario names them.
    """
    fleet = str(agents)
    repo = repository.rstrip("/") or "."
    base_image = "${BASE_IMAGE:-python:3.11-slim}"
    build: dict[str, JsonValue] = {"context": repo, "args": {"BASE_IMAGE": base_image}}
    scenario_mount = f"{scenario}:{SCENARIO_IN_CONTAINER}:ro"

    trace_mounts = [f"{path}:{path}:ro" for path in traces or []]
    token = "${AIRGOSSIP_TOKEN:-}"
    coordinator_command: list[JsonValue] = [
        "coordinator", "--listen", "0.0.0.0:7070", "--metrics-port", "9470",
        "--db", "/var/lib/airgossip/data/fleet.db", SERVE_UNTIL_STOPPED,
        "--config", SCENARIO_IN_CONTAINER, "--agents", fleet, "--certs", CERTS,
    ]  # fmt: skip
    # The agents get the scenario (and the fleet size) from the coordinator; the entry point
    # adds --certs with the claimed index's own certificate (AIRGOSSIP_CERTS).
    agent_command: list[JsonValue] = [
        "agent", "--coordinator", "coordinator:7070", "--listen", "0.0.0.0:7000",
        "--metrics-listen", "0.0.0.0:9100", "--kernel-links", "eth0",
        SERVE_UNTIL_STOPPED, "--threads", "1", "--checkpoint-dir", CHECKPOINTS,
    ]  # fmt: skip
    certs_ready: dict[str, JsonValue] = {"certs": {"condition": "service_completed_successfully"}}
    certs: dict[str, JsonValue] = {
        "image": IMAGE,
        # The first service to start builds the image (one build for the stack).
        "build": build,
        # As the image's own user: the volume starts as the image's folder, owned by it.
        "entrypoint": ["python", "/usr/local/lib/airgossip/fleet_certs.py"],
        "command": [AUTHORITY, CERTS, fleet],
        # The authority's key in a volume of its own, which no other service mounts.
        "volumes": [f"fleet-ca:{AUTHORITY}", f"fleet-certs:{CERTS}"],
        "restart": "no",
    }
    coordinator: dict[str, JsonValue] = {
        "image": IMAGE,
        "init": True,
        "command": coordinator_command,
        "environment": {
            "AIRGOSSIP_HEALTH_ADDRESS": "127.0.0.1:7070",
            "AIRGOSSIP_HEALTH_CERTS": CERTS,
            "AIRGOSSIP_HEALTH_IDENTITY": "coordinator",
            "AIRGOSSIP_TOKEN": token,
        },
        # The run's results.json, plot and summary go to runs/<run id> in the data volume.
        "working_dir": "/var/lib/airgossip/data",
        "volumes": [
            "coordinator-data:/var/lib/airgossip/data",
            f"fleet-certs:{CERTS}:ro",
            scenario_mount,
            *trace_mounts,
        ],
        "ports": ["127.0.0.1:${AIRGOSSIP_COORDINATOR_PORT:-9470}:9470"],
        "depends_on": certs_ready,
        # It serves the finished run until the stack is brought down; it comes back (from
        # its database) if it fails.
        "restart": "on-failure",
    }
    agent: dict[str, JsonValue] = {
        "image": IMAGE,
        "init": True,
        # tc and iptables on the container's own interface: root, with NET_ADMIN.
        "user": "root",
        "cap_add": ["NET_ADMIN"],
        "command": agent_command,
        "environment": {
            "AIRGOSSIP_INDEX": "claim",
            "AIRGOSSIP_CERTS": CERTS,
            "AIRGOSSIP_ADVERTISE_PORT": "7000",
            "AIRGOSSIP_HEALTH_ADDRESS": "127.0.0.1:7000",
            "AIRGOSSIP_TOKEN": token,
            "OMP_NUM_THREADS": "1",
        },
        "volumes": [
            f"agent-claims:{CLAIMS}",
            f"fleet-certs:{CERTS}:ro",
            f"agent-checkpoints:{CHECKPOINTS}",
            *trace_mounts,
        ],
        "depends_on": {**certs_ready, "coordinator": {"condition": "service_started"}},
        "deploy": {"replicas": fleet if not fleet.isdigit() else int(fleet)},
        "restart": "on-failure",
    }
    prometheus: dict[str, JsonValue] = {
        "image": PROMETHEUS_IMAGE,
        # Built only where the image is missing (deploy/docker/build makes it offline).
        "build": {
            "context": f"{repo}/deploy/docker/prometheus",
            "args": {"PROMETHEUS_UPSTREAM": PROMETHEUS_UPSTREAM},
        },
        "command": [
            "--config.file=/etc/prometheus/prometheus.yml",
            "--storage.tsdb.path=/prometheus",
            "--web.listen-address=0.0.0.0:9090",
        ],
        "volumes": [
            f"{repo}/deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro",
            f"{repo}/deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro",
            "prometheus-data:/prometheus",
        ],
        "ports": ["127.0.0.1:${AIRGOSSIP_PROMETHEUS_PORT:-9090}:9090"],
        "depends_on": ["coordinator"],
        "restart": "unless-stopped",
    }
    grafana: dict[str, JsonValue] = {
        "image": GRAFANA_IMAGE,
        "profiles": [GRAFANA_PROFILE],
        "environment": {
            "GF_AUTH_ANONYMOUS_ENABLED": "true",
            "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
            "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH": (
                "/var/lib/grafana/dashboards/airgossip-fleet.json"
            ),
        },
        "volumes": [
            f"{repo}/deploy/grafana/provisioning:/etc/grafana/provisioning:ro",
            f"{repo}/deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro",
        ],
        "ports": ["127.0.0.1:${AIRGOSSIP_GRAFANA_PORT:-3000}:3000"],
        "depends_on": ["prometheus"],
        "restart": "unless-stopped",
    }
    return {
        "services": {
            "certs": certs,
            "coordinator": coordinator,
            "agent": agent,
            "prometheus": prometheus,
            "grafana": grafana,
        },
        "volumes": {
            "fleet-ca": {},
            "fleet-certs": {},
            "coordinator-data": {},
            "agent-claims": {},
            "agent-checkpoints": {},
            "prometheus-data": {},
        },
    }


def compose_yaml(document: dict[str, JsonValue], header: str) -> str:
    """``document`` as YAML, after ``header`` (comment lines)."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    _yaml_block(document, 0, lines)
    return "\n".join(lines) + "\n"


def _yaml_scalar(value: JsonValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a YAML double-quoted scalar


def _yaml_block(value: dict[str, JsonValue], indent: int, lines: list[str]) -> None:
    pad = " " * indent
    for key, item in value.items():
        if isinstance(item, dict):
            if item:
                lines.append(f"{pad}{key}:")
                _yaml_block(item, indent + 2, lines)
            else:
                lines.append(f"{pad}{key}: {{}}")
        elif isinstance(item, list):
            lines.append(f"{pad}{key}:")
            lines += [f"{pad}  - {_yaml_scalar(v)}" for v in item]
        else:
            lines.append(f"{pad}{key}: {_yaml_scalar(item)}")


#: The top-level docker-compose.yml's own header.
TOP_LEVEL_HEADER = """\
airgossip: a coordinator, agents, Prometheus and Grafana on one Docker host.

  deploy/docker/build           # the airgossip and Prometheus images, with no registry
  docker-compose up -d || docker-compose down -v
                                # 4 agents (AIRGOSSIP_AGENTS=8 for 8), Prometheus on :9090;
                                # a failed `up` removes what it made
  docker-compose --profile grafana up -d
                                # and Grafana on http://127.0.0.1:3000 (its image comes
                                # from a registry)
  docker-compose down -v        # stop and remove everything, data included

Everything speaks mutual TLS with certificates the one-shot `certs` service issues into a
volume (one trust domain on this host: see docs/deployment.md). Each agent shapes its own
links in the kernel inside its container (root, NET_ADMIN) and keeps checkpoints. After the
last round the coordinator and the agents stay up, idle, serving their final state to
Prometheus until `down`. The scenario is deploy/compose/scenario.toml
(AIRGOSSIP_SCENARIO=FILE for another); other variables: AIRGOSSIP_IMAGE, BASE_IMAGE,
AIRGOSSIP_TOKEN, PROMETHEUS_IMAGE, PROMETHEUS_UPSTREAM, GRAFANA_IMAGE,
AIRGOSSIP_{COORDINATOR,PROMETHEUS,GRAFANA}_PORT.
docs/deployment.md has the details.
Written by `python -m airgossip.compose` (airgossip/compose.py): edit that, not this file.
"""


def top_level_compose() -> str:
    """The repository's ``docker-compose.yml``."""
    document = compose_document(
        agents="${AIRGOSSIP_AGENTS:-4}",
        scenario="${AIRGOSSIP_SCENARIO:-./deploy/compose/scenario.toml}",
        repository=".",
    )  # fmt: skip
    return compose_yaml(document, TOP_LEVEL_HEADER)


if __name__ == "__main__":
    root = repository_root()
    if root is None:
        raise SystemExit("run this from the repository's checkout")
    (root / "docker-compose.yml").write_text(top_level_compose())
