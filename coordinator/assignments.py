"""The graph the coordinator assigns: epochs, assignments, and a graph schedule followed.

:class:`AssignmentKeeper` turns the live agents into the policy's next graph and every
agent's :class:`~airgossip.common.topology.Assignment`, one epoch at a time, and commits each epoch
to the :class:`~airgossip.coordinator.store.FleetStore` (with the member records that changed with
it) before anyone hears of it. It is driven by
:class:`~airgossip.coordinator.membership.Membership`, under the membership's lock.

A policy with a graph schedule (:class:`~airgossip.coordinator.policy.SwitchingPolicy`) is told the
fleet's figures of every round the whole fleet has passed, in order
(:meth:`AssignmentKeeper.rounds_to_observe`, :meth:`AssignmentKeeper.observe`); a switch is
a new epoch in which every agent keeps its old peers, so what edges that left the graph
still owe is delivered.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence

from airgossip.common.topology import (
    Assignment,
    assignments_for_graph,
    fleet_figures,
    switched_assignments,
)
from airgossip.coordinator.graphs import FleetGraph
from airgossip.coordinator.policy import EdgeListPolicy, TopologyPolicy, TopologySpec
from airgossip.coordinator.refusal import Refusal
from airgossip.coordinator.store import FleetStore, MemberRecord, StoredFleet
from airgossip.edge.observability.stats import RoundRecord

log = logging.getLogger("airgossip.coordinator")


class AssignmentKeeper:
    """The current graph, its epoch and every agent's assignment (not thread-safe: its
    owner's lock guards it).

    Parameters
    ----------
    spec, policy:
        The topology and the policy that maintains it.
    store:
        Where every epoch is committed.
    """

    def __init__(self, spec: TopologySpec, policy: TopologyPolicy, store: FleetStore) -> None:
        self.spec = spec
        self.policy = policy
        self.store = store
        self.graph: FleetGraph | None = None
        self.epoch = 0
        self.assignments: dict[str, Assignment] = {}
        #: The next round whose figures the policy's switcher is told.
        self.next_observed = 1

    def restore(self, stored: StoredFleet) -> None:
        """Take back the graph, assignments and policy state of a stored fleet."""
        self.assignments = dict(stored.assignments)
        self.epoch = stored.epoch
        self.graph = FleetGraph.from_json(stored.graph) if stored.graph else None
        self.policy.restore(stored.policy_state)
        switcher = self.policy.switcher
        if switcher is not None and switcher.switched_at:
            # The rounds since the last switch are told again from the stored reports: the
            # switcher's streak and loss window come back exactly as they were.
            self.next_observed = switcher.switched_at[-1]

    @property
    def lambda2(self) -> float:
        """Second-largest |eigenvalue| of the current mixing (NaN before the first graph)."""
        first = next(iter(self.assignments.values()), None)
        return first.lambda2 if first is not None else math.nan

    def rebuild(
        self,
        why: str,
        alive: Sequence[str],
        addresses: Mapping[str, str],
        records: Iterable[MemberRecord],
        *,
        keep_peers: bool = False,
    ) -> None:
        """A new epoch on the policy's next graph over ``alive`` (``keep_peers``: every
        agent's directory keeps its old peers, for a switch of graphs), committed with the
        member ``records`` that changed."""
        epoch = self.epoch + 1
        graph = self.policy.graph(alive, self.graph, epoch)
        wanted = {i: addresses[i] for i in graph.ids}
        scheme = self.spec.scheme
        if keep_peers:
            assignments = switched_assignments(
                self.assignments, graph.graph, wanted, epoch=epoch, scheme=scheme
            )
        else:
            assignments = assignments_for_graph(graph.graph, wanted, epoch=epoch, scheme=scheme)
        self.store.commit(
            records,
            epoch=epoch,
            graph=graph.to_json(),
            policy_state=self.policy.state(),
            assignments=assignments,
        )
        self.epoch, self.graph, self.assignments = epoch, graph, assignments
        log.info(
            "epoch %d (%s): %d agents, %s, strongly connected: %s, |lambda2| %.4f",
            epoch, why, len(alive), graph.graph.name, graph.strongly_connected, self.lambda2,
        )  # fmt: skip

    def set_edges(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Replace the policy's edge list (``edges`` topology; the caller rebuilds)."""
        if not isinstance(self.policy, EdgeListPolicy):
            raise Refusal(
                "FAILED_PRECONDITION",
                f"edge lists need topology 'edges', this fleet runs '{self.spec.name}'",
            )
        self.policy.set_edges(list(pairs))

    def rounds_to_observe(self, passed: int) -> list[int]:
        """The rounds the switcher is yet to be told, up to ``passed`` (every counted agent
        reported it); none without a schedule, or once it is finished."""
        switcher = self.policy.switcher
        if switcher is None or self.graph is None or switcher.finished:
            return []
        return list(range(self.next_observed, passed + 1))

    def observe(self, round_index: int, records: Sequence[RoundRecord], agents: int) -> str:
        """Tell the switcher the fleet's figures of ``round_index``; return the name of the
        graph it switches to ('' for none; the caller rebuilds, keeping peers)."""
        switcher = self.policy.switcher
        if switcher is None or switcher.finished:
            return ""
        self.next_observed = round_index + 1
        graph = switcher.observe(fleet_figures(round_index, records, agents))
        return graph.name if graph is not None else ""
