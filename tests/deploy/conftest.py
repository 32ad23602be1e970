"""What the deployment tests share: a real Docker engine, the airgossip image and a
Prometheus image.

CI starts from a clean machine, so the engine fixture installs Debian's ``docker.io`` and
``docker-compose`` when they are missing (root) and starts ``dockerd`` when nothing answers
(stopping it at the end); elsewhere, without root, the tests that need an engine are skipped
with the reason. There is no image registry here: the image comes from
``deploy/docker/build`` (a debootstrapped base, made once and kept by the engine, torch from
the wheel on disk), and Prometheus's image from this machine's own Prometheus binary.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

import pytest

from tests.support.cli import ROOT

IMAGE = "airgossip:latest"
#: What deploy/docker/build makes beside the airgossip image (the compose file's default).
PROMETHEUS_IMAGE = "airgossip-prometheus:latest"
BASE_IMAGE = "airgossip-base:bookworm"
#: Compose projects of the tests are named with this prefix, then this session's own part
#: (:data:`SESSION_PROJECTS`), then a random part per project.
PROJECT_PREFIX = "agtest"
#: What every compose project of this test session is named with: on a Docker host shared
#: with other people (and other test sessions) the fixtures remove only what this session
#: made, never all of ``agtest*`` nor every container fleet (label ``airgossip.run``).
SESSION_PROJECTS = f"{PROJECT_PREFIX}{uuid.uuid4().hex[:6]}"


def load_script(name: str) -> ModuleType:
    """A script of ``deploy/grafana`` (not a package) as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "deploy" / "grafana" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Engine:
    """The ``docker`` and ``docker-compose`` commands of a running engine."""

    docker: str
    compose: str

    def run(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        result = subprocess.run(
            [self.docker, *args], capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout.strip()


def _answers(docker: str) -> bool:
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _install() -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("needs a Docker engine: apt-get install docker.io docker-compose (root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    packages = ["docker.io", "docker-compose", "debootstrap"]
    install = ["apt-get", "install", "-y", "-qq", *packages]
    if subprocess.run(install, capture_output=True, env=env, timeout=600).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, timeout=600)
        subprocess.run(install, check=True, capture_output=True, env=env, timeout=600)


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A Docker engine that answers (installed and started here if need be)."""
    if not all(shutil.which(tool) for tool in ("docker", "docker-compose", "debootstrap")):
        _install()
    docker = shutil.which("docker")
    compose = shutil.which("docker-compose")
    assert docker and compose
    daemon: subprocess.Popen[bytes] | None = None
    if not _answers(docker):
        if os.geteuid() != 0 or shutil.which("dockerd") is None:
            pytest.skip("the Docker engine does not answer and cannot be started here (root)")
        log = tmp_path_factory.mktemp("dockerd") / "dockerd.log"
        with log.open("wb") as out:
            daemon = subprocess.Popen(["dockerd"], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while not _answers(docker):
            if daemon.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"dockerd did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
    engine = Engine(docker, compose)
    try:
        yield engine
    finally:
        remove_session(engine)
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                daemon.kill()


def remove_session(engine: Engine) -> None:
    """Remove what this test session's compose projects left on the engine (a test that
    failed before its own ``down``): their containers, networks and volumes, and nothing
    else. Other people's fleets and other sessions' projects on a shared engine are left
    alone; so is what a killed session left (its projects are named ``agtest<its part>*``:
    ``docker-compose -p NAME down -v`` removes one by hand). Container fleets remove their
    own containers and network (``airgossip.run=<tag>``), and their tests remove only the
    fleet they started."""

    def of_session(kind: str, name: str) -> list[str]:
        fields = f'{{{{{name}}}}} {{{{.Label "com.docker.compose.project"}}}}'
        listed = engine.run(*kind.split(), "--format", fields, check=False).splitlines()
        return [
            name for name, _, project in (line.partition(" ") for line in listed)
            if project.startswith(SESSION_PROJECTS)
        ]  # fmt: skip

    containers = of_session("ps -a", ".ID")
    if containers:
        engine.run("rm", "-f", *containers, timeout=300, check=False)
    networks = of_session("network ls", ".ID")
    if networks:
        engine.run("network", "rm", *networks, check=False)
    volumes = of_session("volume ls", ".Name")
    if volumes:
        engine.run("volume", "rm", "-f", *volumes, check=False)


@pytest.fixture(scope="session")
def image(engine: Engine) -> str:
    """The airgossip image of this working tree (``deploy/docker/build``)."""
    started = time.monotonic()
    result = subprocess.run(
        [str(ROOT / "deploy" / "docker" / "build"), IMAGE],
        capture_output=True, text=True, timeout=1500,
        env={**{k: v for k, v in os.environ.items() if k != "PROMETHEUS_IMAGE"},
         "DOCKER": engine.docker},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    print(f"\n{result.stdout.strip()} (fixture: {time.monotonic() - started:.0f} s)")
    return IMAGE


@pytest.fixture(scope="session")
def prometheus_image(engine: Engine, image: str) -> str:
    """The compose stack's Prometheus image, made by ``deploy/docker/build`` with the
    airgossip image: this machine's binary (Debian's package) on the base image."""
    assert shutil.which("prometheus"), (
        "prometheus is missing: `./scripts/install --dev` installs Debian's package"
    )
    engine.run("image", "inspect", PROMETHEUS_IMAGE)
    return PROMETHEUS_IMAGE
