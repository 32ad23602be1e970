"""``containers`` mode: one Docker container per agent, an embedded coordinator, and each
agent's links shaped by the kernel inside its own container.

The fleet makes a Docker network of its own, starts the coordinator in this process on that
network's gateway address, and runs the agent module (``python -m
airgossip.emulation.agent``, in place of the image's ``airgossip`` entry point) in one
container per agent (the image of
``[containers] image``) through :class:`~airgossip.emulation.fleets.processes.AgentProcesses`:
the parts of the run's folder an agent needs (the config, ``agents/`` for records, its own
checkpoint folder) are mounted into its container, so records, progress and results work as
in the process mode. Unless the run is insecure, the run's throwaway certificate authority
(its key never written) gives every member a certificate, and each container sees only the
CA's certificate and its own certificate and key (read-only), never the other members' keys.
With ``NET_ADMIN`` (the default) every agent applies its share of the
network's :class:`~airgossip.node.network.KernelLinks` on its own interface
(:class:`~airgossip.emulation.networks.kernel.AgentKernelLinks`); without it, or where the engine
refuses it, the agent says so in its log and shapes its links itself. Containers, and the
network, are removed at the end, on Ctrl-C and on errors; all carry the label
``airgossip.run=<tag>``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from airgossip.common.identity import agent_ids
from airgossip.common.security.private_files import private_folder
from airgossip.common.security.tls import CA_CERT
from airgossip.emulation.fleets.agent_fleet import AgentProcessFleet
from airgossip.emulation.fleets.agent_server import AGENT_MODULE
from airgossip.emulation.fleets.base import FleetError, Launch
from airgossip.emulation.fleets.processes import AgentHost
from airgossip.emulation.networks import Network
from airgossip.emulation.networks.kernel import AgentKernelReport, ContainerKernelReport
from airgossip.node.command import AgentCommand
from airgossip.scenario.config import RunConfig
from airgossip.scenario.modes.containers import ContainerSettings

#: Where an agent container sees the run's folder, its own certificates, and its working
#: directory (the image's).
RUN_DIR = Path("/airgossip/run")
CERTS_DIR = Path("/airgossip/certs")
WORKDIR = Path("/var/lib/airgossip")
#: The port agents serve gossip on inside their containers, and their metrics.
AGENT_PORT = 7000
METRICS_PORT = 9100
#: Label on every container and network a run makes.
LABEL = "airgossip.run"


class DockerError(RuntimeError):
    """The Docker engine refused or failed a command."""


def _gone_anyway(error: str) -> bool:
    """Whether a ``docker rm`` error line says the container is (being) removed anyway."""
    return "already in progress" in error or "No such container" in error


class DockerEngine:
    """The few ``docker`` commands a container fleet needs (the CLI of this machine)."""

    def __init__(self, docker: str = "docker") -> None:
        self.docker = docker

    def _run(self, *args: str, timeout: float = 60) -> str:
        try:
            result = subprocess.run(
                [self.docker, *args], capture_output=True, text=True, timeout=timeout
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise DockerError(f"docker {args[0]}: {err}") from None
        if result.returncode != 0:
            raise DockerError(f"docker {' '.join(args[:2])}: {result.stderr.strip()}")
        return result.stdout.strip()

    def unavailable(self, image: str) -> str | None:
        """Why containers cannot run here (None: they can)."""
        if shutil.which(self.docker) is None:
            return "the docker command is not installed (apt-get install docker.io)"
        try:
            self._run("version", "--format", "{{.Server.Version}}", timeout=20)
        except DockerError as err:
            return f"the Docker engine does not answer ({err}); start it (dockerd)"
        try:
            self._run("image", "inspect", "--format", "{{.Id}}", image, timeout=20)
        except DockerError:
            return (
                f"image '{image}' not found; build it with `docker-compose build` or "
                "deploy/docker/build, or name another in [containers] image"
            )
        return None

    def create_network(self, name: str, tag: str) -> str:
        """Create a bridge network; return its gateway address (this machine on it)."""
        self._run("network", "create", "--driver", "bridge", "--label", f"{LABEL}={tag}", name)
        gateway = self._run(
            "network", "inspect", "--format", "{{range .IPAM.Config}}{{.Gateway}}{{end}}", name
        )
        if not gateway:
            raise DockerError(f"network {name} has no IPv4 gateway")
        return gateway

    def remove(self, tag: str) -> None:
        """Remove every container and network labelled with ``tag`` (idempotent)."""
        where = f"label={LABEL}={tag}"
        containers = self._run("ps", "-aq", "--filter", where).split()
        if containers:
            try:
                self._run("rm", "-f", *containers, timeout=120)
            except DockerError as err:
                # Containers that exited are being removed by the engine (--rm) already.
                if not all(_gone_anyway(line) for line in str(err).splitlines()):
                    raise
        deadline = time.monotonic() + 60
        while self._run("ps", "-aq", "--filter", where) and time.monotonic() < deadline:
            time.sleep(0.5)  # the network can go only once no container is attached
        networks = self._run("network", "ls", "-q", "--filter", where).split()
        if networks:
            self._run("network", "rm", *networks)

    def left(self, tag: str) -> list[str]:
        """Containers and networks still labelled with ``tag``."""
        where = f"label={LABEL}={tag}"
        return [
            *self._run("ps", "-aq", "--filter", where).split(),
            *self._run("network", "ls", "-q", "--filter", where).split(),
        ]


class ContainerFleet(AgentProcessFleet):
    """Agents in Docker containers on a network of their own, an embedded coordinator on
    its gateway; each agent shapes its own links in the kernel (NET_ADMIN)."""

    mode = "containers"
    links_in_kernel = True
    serves_metrics = True
    settings_model = ContainerSettings
    # The image's Python runs the agent module; the run's folder and each agent's own
    # credentials are mounted where it sees them.
    host = AgentHost(
        command=("python", "-m", AGENT_MODULE), run_dir=RUN_DIR, parent_pid=False,
        certs_dir=CERTS_DIR,
    )  # fmt: skip

    def __init__(self, config: RunConfig, network: Network, launch: Launch) -> None:
        super().__init__(config, network, launch)
        self.settings = config.mode_settings(ContainerSettings)
        self.engine = DockerEngine()
        self.tag = uuid.uuid4().hex[:10]
        self._made_network = False
        #: What each agent's kernel shaping applied and measured (also ``kernel.json``).
        self.report: ContainerKernelReport | None = None

    @classmethod
    def refuse(cls, config: RunConfig, network: Network) -> str | None:
        if not 1 <= config.agents <= 250:
            return f"mode 'containers' runs 1 to 250 agents, not {config.agents}"
        reason = DockerEngine().unavailable(config.mode_settings(ContainerSettings).image)
        return None if reason is None else f"mode 'containers': {reason}"

    def _mounts(self, agent_id: str) -> list[str]:
        """What of the run's folder the agent's container sees: the config (read-only), the
        records folder, its checkpoints and its own credentials (read-only)."""
        agents, folder = self.agents, self.folder
        checkpoints = folder.checkpoint_dir(agent_id)
        private_folder(agents.stats_dir)
        mounts = [
            f"{folder.config_path}:{agents.seen(folder.config_path)}:ro",
            f"{agents.stats_dir}:{agents.seen(agents.stats_dir)}",
            f"{checkpoints}:{agents.seen(checkpoints)}",
        ]
        if agents.secure:
            credentials = folder.credentials(agent_id)
            mounts += [
                f"{credentials / name}:{CERTS_DIR / name}:ro"
                for name in (CA_CERT, f"{agent_id}.pem", f"{agent_id}.key")
            ]
        return [part for mount in mounts for part in ("--volume", mount)]

    def _docker_run(self, agent_id: str) -> list[str]:
        """``docker run`` up to the image: the rest of the line is the agent's command."""
        if self.settings.net_admin:
            # tc and iptables on the container's own interface: root with NET_ADMIN there.
            user = ["--cap-add", "NET_ADMIN", "--user", "0:0"]
        else:
            user = ["--user", f"{os.getuid()}:{os.getgid()}"]
        # A wireless scenario's rate traces, where the agents' config names them.
        traces = []
        if self.config.wireless is not None:
            for trace in self.config.wireless.traces:
                inside = trace.file if trace.file.is_absolute() else WORKDIR / trace.file
                traces += ["--volume", f"{trace.file.resolve()}:{inside}:ro"]
        return [
            self.engine.docker, "run", "--rm", "--init",
            "--name", f"airgossip-{self.tag}-{agent_id}",
            "--network", f"airgossip-{self.tag}", "--label", f"{LABEL}={self.tag}",
            *user, *self._mounts(agent_id), *traces,
            "--env", "HOME=/tmp", "--env", "OMP_NUM_THREADS=1", "--env", "PYTHONUNBUFFERED=1",
            # The image's health check dials the agent as the agent (mutual TLS).
            *(["--env", f"AIRGOSSIP_HEALTH_CERTS={CERTS_DIR}"] if self.agents.secure else []),
            # The agent module, not the image's entry point (the `airgossip` command).
            "--entrypoint", "", self.settings.image,
        ]  # fmt: skip

    def start_agents(self) -> None:
        try:
            gateway = self.engine.create_network(f"airgossip-{self.tag}", self.tag)
        except DockerError as err:
            raise FleetError(f"mode 'containers': {err}") from None
        self._made_network = True
        port = self.launch.coordinator_listen.rpartition(":")[2]
        address = self.start_coordinator(
            f"{gateway}:{port}", metrics_note="; agents' metrics on their containers"
        )
        unapplied = self.network.kernel_links().unapplied
        if unapplied:
            self.launch.notice("the kernel does not apply: " + "; ".join(unapplied))
        # Every agent tries the kernel; one without NET_ADMIN says so and shapes its links
        # itself. It advertises its own address on the fleet's network (`:PORT`).
        own = AgentCommand(
            coordinator=address, listen=f"0.0.0.0:{AGENT_PORT}", advertise=f":{AGENT_PORT}",
            metrics_listen=f"0.0.0.0:{METRICS_PORT}", kernel_links="eth0",
        )  # fmt: skip
        for index, agent_id in enumerate(agent_ids(self.config.agents)):
            self.agents.spawn(index, agent_id, own, prefix=self._docker_run(agent_id))

    def close(self) -> None:
        try:
            if self._made_network:
                self.engine.remove(self.tag)
        finally:
            super().close()
            self._own_files()
            self._write_report()

    def _own_files(self) -> None:
        """Hand files the agents wrote as root back to the launcher's user."""
        if not self.settings.net_admin or os.geteuid() == 0:
            return
        subprocess.run(
            [self.engine.docker, "run", "--rm", "--user", "0:0", "--entrypoint", "chown",
             "--volume", f"{self.folder.path}:{RUN_DIR}", self.settings.image,
             "-R", f"{os.getuid()}:{os.getgid()}", str(RUN_DIR)],
            capture_output=True, timeout=120,
        )  # fmt: skip

    def _write_report(self) -> None:
        """``kernel.json``: every agent's kernel shaping (its in-links), or why it had none."""
        agents = [
            AgentKernelReport.read(
                self.agents.stats_dir / f"{agent.agent_id}.kernel.json", agent.agent_id
            )
            for agent in self.agents.agents
        ]
        if not agents:
            return
        self.report = ContainerKernelReport.gather(agents)
        self.report.write(self.folder.path / "kernel.json")
        if self.report.fallback:
            self.launch.notice(
                f"{len(self.report.fallback)} of {len(agents)} agents shaped their links in "
                f"the agent, not the kernel (kernel.json says why)"
            )
