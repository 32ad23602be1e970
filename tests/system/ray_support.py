"""A real Ray cluster of several nodes on this machine's loopback, for the ``ray`` mode's
tests: ``ray.cluster_utils.Cluster``, every node with its own resources, no dashboard, a
small object store; this process joins it as the driver."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray._private import ray_constants  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

#: What every node is started with: loopback only, logical CPUs for its agents.
NODE: dict[str, Any] = {
    "node_ip_address": "127.0.0.1",
    "num_cpus": 8,
    "include_dashboard": False,
    "object_store_memory": 80 * 1024 * 1024,
}
#: The head's GCS declares a node dead within about a second of its raylet going silent.
FAST_FAILURE_DETECTION = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}


@contextmanager
def ray_cluster(
    monkeypatch: pytest.MonkeyPatch,
    nodes: int,
    *,
    cpus: float | None = None,
    homes: Path | None = None,
    system_config: dict[str, Any] | None = None,
) -> Iterator[Cluster]:
    """A cluster of ``nodes`` nodes on loopback (resource ``node-<i>`` on node ``i``), this
    process connected to it; shut down on exit. ``cpus``: logical CPUs of each node
    (default: :data:`NODE`'s); ``homes``: the nodes' temporary folder (``TMPDIR``: where the
    agent actors make their private folders; short: Ray's sockets live under it too);
    ``system_config``: the head's (default: :data:`FAST_FAILURE_DETECTION`; ``{}``: Ray's
    own health checks)."""
    if homes is not None:
        monkeypatch.setenv("TMPDIR", str(homes))
    node = {**NODE, "num_cpus": cpus} if cpus is not None else NODE
    config = FAST_FAILURE_DETECTION if system_config is None else system_config
    # Ray binds to and dials the machine's interface address unless told the machine is no
    # cluster member (its processes read the variable; this one already imported Ray).
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **node, "resources": {"node-0": 1}, "_system_config": config,
        },
    )  # fmt: skip
    try:
        for index in range(1, nodes):
            cluster.add_node(**node, resources={f"node-{index}": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def host_actors() -> list[dict[str, Any]]:
    """Ray's own records (the GCS actor table) of every host actor (the agents' hosts):
    node, restarts, state.

    The public state API (``ray.util.state``) needs the dashboard, which these clusters run
    without; the GCS table it reads is the same record."""
    from ray._private import state

    return [a for a in state.actors().values() if a.get("ActorClassName") == "RayAgentHost"]


def agent_homes(folder: Path) -> list[Path]:
    """The agents' private folders (keys, certificates) in their hosts' folders in ``folder``."""
    return sorted(folder.glob("airgossip-host-*/agent-*"))


def leftovers(folder: Path) -> list[Path]:
    """Whatever the hosts left of their private folders in ``folder``."""
    return sorted(folder.glob("airgossip-*"))
