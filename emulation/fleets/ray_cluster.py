"""The Ray side of the ``ray`` fleet: join a cluster (or start a local one on loopback),
place the agents' hosts with a placement group (one bundle per host, its agents' resources),
start the host actors and the checkpoint store, and take it all down again. Ray is imported
only here and in the actors' modules."""

from __future__ import annotations

import logging
import math
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from airgossip.emulation.fleets.base import FleetError
from airgossip.emulation.fleets.ray_host import RayAgentHost, RayHostSpec
from airgossip.node.ray_agent import CheckpointKeeper
from airgossip.scenario.modes.ray import RaySettings

K = TypeVar("K")

#: Placement group strategies by ``[ray] placement``.
STRATEGIES = {"spread": "SPREAD", "strict-spread": "STRICT_SPREAD", "pack": "PACK"}
#: Longest wait for the cluster to find room for every agent.
PLACE_TIMEOUT_S = 120.0
#: Longest wait for one call on every actor at the end of a run.
CALL_TIMEOUT_S = 20.0


#: The variable that keeps every process of a local Ray on loopback (read when Ray is imported).
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: States of an actor (Ray's GCS actor table) that wait for a place on the cluster.
UNPLACED_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "RESTARTING")
#: Ray's Python loggers (its own output: into the run folder's ``logs/ray.log``).
RAY_LOGGERS = ("ray",)


class RayOutput:
    """Ray's own output on the driver (its Python loggers, and the messages the raylets and
    the GCS push to the driver: a node's death, worker-count warnings) into one file, away
    from the terminal, for as long as the run holds it.

    Ray prints the pushed messages from a listener thread through
    ``ray._private.worker.print_to_stdstream`` whatever ``log_to_driver`` says (2.55): that
    function is swapped for one writing the file, and put back on :meth:`release`.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handler = logging.FileHandler(path)
        self.handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        self._saved: list[tuple[logging.Logger, bool, int]] = []
        self._printer: Any = None

    def hold(self) -> None:
        """Route Ray's loggers and pushed messages into the file."""
        for name in RAY_LOGGERS:
            logger = logging.getLogger(name)
            self._saved.append((logger, logger.propagate, logger.level))
            logger.addHandler(self.handler)
            logger.propagate = False
            logger.setLevel(logging.INFO)
        try:
            from ray._private import worker
        except ImportError:  # pragma: no cover - a Ray without it prints as it prints
            return
        self._printer = worker.print_to_stdstream
        pushed = logging.getLogger("ray.pushed")

        def to_file(data: dict[str, Any], ignore_prefix: bool = False) -> None:
            source = data.get("pid", "ray")
            for line in data.get("lines", []):
                pushed.info("(%s) %s", source, line)

        worker.print_to_stdstream = to_file

    def release(self) -> None:
        """Put Ray's loggers and printer back; close the file."""
        if self._printer is not None:
            from ray._private import worker

            worker.print_to_stdstream = self._printer
            self._printer = None
        for logger, propagate, level in self._saved:
            logger.removeHandler(self.handler)
            logger.propagate, logger.level = propagate, level
        self._saved.clear()
        self.handler.close()


def _loopback_only() -> None:
    """Keep a local Ray on loopback even where Ray was imported before :data:`LOOPBACK_ONLY`
    was set (it reads the variable once, on import)."""
    from ray._private import ray_constants

    if os.environ.get(LOOPBACK_ONLY) == "0":
        ray_constants.ENABLE_RAY_CLUSTER = False


class RayCluster:
    """A connection to a Ray cluster for one run.

    Parameters
    ----------
    settings:
        ``[ray]`` of the run.
    agents:
        Fleet size (one placement bundle each).
    notice:
        Where what people should know goes (one line each).
    ray_log:
        Where Ray's own output goes (None: where Ray puts it).
    """

    def __init__(
        self,
        settings: RaySettings,
        agents: int,
        notice: Callable[[str], None],
        ray_log: Path | None = None,
    ) -> None:
        self.settings = settings
        self.output = RayOutput(ray_log) if ray_log is not None else None
        self.agents = agents
        self.notice = notice
        self.connected = False
        self.started_ray = False
        self.address = settings.address or "local"
        #: Start a Ray of this run's own on loopback (no address, or ``local``).
        self.local = settings.address in (None, "local")
        self.driver_ip = "127.0.0.1"
        self.group: Any = None
        self.store: Any = None
        #: The checkpoint store actor's name (agents look it up; None: no store).
        self.store_name: str | None = None

    def connect(self) -> None:
        """Join ``[ray] address`` (or the Ray this process already joined), else start a
        local Ray on loopback with room for every agent."""
        local = self.local
        if local:
            # Ray binds to and dials the machine's interface address unless told that the
            # machine is no cluster member (as on macOS): a local Ray stays on loopback.
            os.environ.setdefault(LOOPBACK_ONLY, "0")
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        import ray

        if self.output is not None:
            self.output.hold()
        if not ray.is_initialized():
            try:
                if local:
                    _loopback_only()
                    cpus = max(os.cpu_count() or 1, int(self.agents * self.settings.num_cpus) + 1)
                    # "local": a Ray of its own, whatever RAY_ADDRESS says (the CLI resolved it).
                    ray.init(
                        address="local", _node_ip_address="127.0.0.1", num_cpus=cpus,
                        include_dashboard=False, log_to_driver=False, configure_logging=False,
                    )  # fmt: skip
                else:
                    ray.init(
                        address=self.settings.address, log_to_driver=False,
                        configure_logging=False,
                    )  # fmt: skip
            except (ConnectionError, RuntimeError, ValueError) as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
                raise FleetError(
                    f"mode 'ray': cannot join Ray at {self.address}: {first}"
                ) from None
            self.started_ray = True
        self.connected = True
        self.driver_ip = ray.util.get_node_ip_address()
        self.address = ray.get_runtime_context().gcs_address

    def host_sizes(self) -> list[int]:
        """How many agents each host actor forks: ``[ray] agents_per_host``, else the fleet
        split evenly over the cluster's live nodes with CPUs (one host per node)."""
        per_host = self.settings.agents_per_host
        if per_host is None:
            import ray

            nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
            per_host = math.ceil(self.agents / max(1, len(nodes)))
        hosts = math.ceil(self.agents / per_host)
        # As even as whole agents go: 64 on 3 hosts are 22, 21, 21.
        return [self.agents // hosts + (1 if i < self.agents % hosts else 0) for i in range(hosts)]

    def bundle(self, agents: int) -> dict[str, float]:
        """The resources of a host of ``agents`` agents (what ``[ray]`` reserves per agent)."""
        bundle = {"CPU": round(self.settings.num_cpus * agents, 4)}
        if self.settings.num_gpus:
            bundle["GPU"] = round(self.settings.num_gpus * agents, 4)
        return bundle

    def place(self, sizes: Sequence[int]) -> None:
        """Reserve one bundle per host of ``sizes`` agents (placement group of ``[ray]
        placement``) and start the checkpoint store on the driver's node;
        :class:`FleetError` where the cluster has no room."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.group = placement_group(
            [self.bundle(size) for size in sizes], strategy=STRATEGIES[self.settings.placement]
        )
        ready, _ = ray.wait([self.group.ready()], timeout=PLACE_TIMEOUT_S)
        if not ready:
            total = ray.cluster_resources()
            raise FleetError(
                f"mode 'ray': the cluster has no room for {len(sizes)} hosts of up to "
                f"{max(sizes)} agents ({self.bundle(max(sizes))} each) within "
                f"{PLACE_TIMEOUT_S:.0f} s (it has CPU {total.get('CPU', 0):g}, GPU "
                f"{total.get('GPU', 0):g}); lower [ray] num_cpus / num_gpus / agents_per_host "
                "or add nodes"
            )
        if self.settings.checkpoints is None:
            here = ray.get_runtime_context().get_node_id()
            self.store_name = f"airgossip-checkpoints-{uuid.uuid4().hex[:10]}"
            self.store = (
                ray.remote(CheckpointKeeper)
                .options(
                    name=self.store_name,
                    num_cpus=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
                )
                .remote()
            )

    def start_host(self, index: int, spec: RayHostSpec) -> Any:
        """Start host ``index``'s actor in its bundle; its handle."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index)
        bundle = self.bundle(len(spec.agents))
        return (
            ray.remote(RayAgentHost)
            .options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0),
                max_restarts=self.settings.max_restarts,
                scheduling_strategy=strategy,
            )
            .remote(spec)
        )

    def call_all(self, actors: Mapping[K, Any], method: str) -> dict[K, object]:
        """Call ``method`` on every actor; each one's answer (an exception where it failed)."""
        import ray

        refs = {key: getattr(actor, method).remote() for key, actor in actors.items()}
        # One deadline for all: actors that are gone or stuck do not add up.
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=CALL_TIMEOUT_S)
        out: dict[K, object] = {}
        for key, ref in refs.items():
            try:
                out[key] = ray.get(ref, timeout=0.1)
            except Exception as err:  # a dead, restarting or stuck actor: the error
                out[key] = err
        return out

    def unplaced(self, actors: Mapping[K, Any]) -> set[K]:
        """The actors that wait for a place on the cluster (being created or restarted,
        with no room yet): Ray keeps them pending and says nothing else."""
        from ray._private import state
        from ray._private.worker import global_worker

        wanted = {actor._actor_id.hex(): key for key, actor in actors.items()}
        try:
            table = state.actors(job_id=global_worker.current_job_id)
        except Exception:  # an old or remote GCS without the table: nothing known to wait
            return set()
        return {
            wanted[actor_id] for actor_id, record in table.items()
            if actor_id in wanted and record.get("State") in UNPLACED_STATES
        }  # fmt: skip

    def bundles_without_node(self) -> set[int]:
        """The placement group's bundles (hosts, by index) that no node holds: their nodes
        died and the cluster has no room for them elsewhere (yet)."""
        from ray.util.placement_group import placement_group_table

        if self.group is None:
            return set()
        try:
            placed = placement_group_table(self.group).get("bundles_to_node_id", {})
        except Exception:  # an old or remote GCS without the table: none known to lack one
            return set()
        return {int(index) for index, node in placed.items() if not node}

    def nodes(self) -> list[dict[str, object]]:
        """The cluster's nodes as Ray records them (id, address, alive, resources)."""
        import ray

        return [
            {"node_id": n["NodeID"], "address": n["NodeManagerAddress"], "alive": n["Alive"],
             "resources": n.get("Resources", {})}
            for n in ray.nodes()
        ]  # fmt: skip

    def close(self) -> None:
        """Remove the placement group (its actors with it) and the store; leave Ray if this
        run joined it."""
        import ray

        if not self.connected:
            if self.output is not None:
                self.output.release()
            return
        from ray.util.placement_group import remove_placement_group

        try:
            if self.store is not None:
                ray.kill(self.store)
            if self.group is not None:
                remove_placement_group(self.group)
        finally:
            if self.started_ray:
                ray.shutdown()
            self.connected = False
            if self.output is not None:
                self.output.release()
