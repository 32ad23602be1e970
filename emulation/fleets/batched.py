"""Push-sum consensus of a whole in-process fleet as array operations over every agent.

The lock-step driver (:mod:`.inproc`) runs each agent's :class:`~airgossip.edge.agent.Agent`: per
message, its share, encoding, link verdict, decoding, checks and acknowledgement, about
100 us of Python. For the one workload where none of that varies between agents (the
``consensus`` task, ``push-sum`` without compression, on a static graph) the whole round is
a handful of array operations instead: :class:`BatchedPushSum` keeps every agent's ``(x, y)``
as rows of one array and every edge's running sum as rows of another, and decides every
message's fate with its network's own verdicts in batch (:meth:`Network.message_drops`;
the static network's are its shaper's draws, :mod:`airgossip.emulation.networks.link_draws`).

It is the per-agent code's arithmetic, not an approximation of it: starvation, which edges
carry a message, sequence numbers and rebasing are push-sum's rules
(:mod:`airgossip.edge.algorithms.push_sum_rules`) applied to every edge at once. With
acknowledgements inline, as the in-memory transport gives them, a delivered message hands
over its edge's whole running sum and the edge starts again from zero; a dropped one leaves
the sum to grow until the next message lands
(:class:`~airgossip.edge.algorithms.push_sum.PushSum`). Receivers add what arrives in the
order the agents push (by index), so the estimates equal the per-agent path's to the last
bits of a fused multiply-add; drops and counts are exactly the same
(tests/emulation/test_batched_fleet.py, tests/emulation/test_push_sum_conformance.py).
Each agent's round records are written as its agent would write them: counters, weight,
estimate.

:func:`batched_refusal` says when it applies; the in-process fleet picks it by itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy.sparse import csr_array

from airgossip.common.topology import Graph, adjacency_edges
from airgossip.edge.agent.build import fleet_digest
from airgossip.edge.agent.sending import Sender, gossip_message
from airgossip.edge.algorithms import Payload
from airgossip.edge.algorithms.base import SEQ_SLACK
from airgossip.edge.algorithms.push_sum_rules import (
    flushes,
    kept_weight,
    numbered,
    rebases,
    starved,
)
from airgossip.edge.observability.stats import Counters, RoundRecord, StatsSink, probe_estimate
from airgossip.edge.settings import resolve_codec
from airgossip.edge.tasks import TaskContext, load_task
from airgossip.edge.tasks.consensus import ConsensusOptions, consensus_vector
from airgossip.edge.tasks.options import parse_options
from airgossip.edge.transport.wire import wire_bytes
from airgossip.emulation.networks import Network
from airgossip.node.network import BatchedDrops
from airgossip.scenario.config import RunConfig

#: The epoch of a static graph's assignments (``assignments_for_graph``'s first).
STATIC_EPOCH = 1
#: Edges updated per block: bounds the temporaries to a few tens of MB.
BLOCK_EDGES = 1 << 16


def workload_refusals(config: RunConfig, network: Network) -> list[str]:
    """Why ``config``'s workload is not the one the fast paths take (empty: it is): the
    ``consensus`` task with ``push-sum``, lossless codec, float64, no options or privacy,
    column-stochastic weights, at most ``SEQ_SLACK`` rounds (an edge's sequence numbers
    then never wrap), one gossip step a round (what ``auto`` takes for consensus). Both
    :func:`batched_refusal` and the virtual clock's
    :func:`~airgossip.emulation.fleets.virtual_fast.fast_refusal` start from it."""
    settings = [
        (config.task.name == "consensus", "the task is not consensus"),
        (config.algorithm == "push-sum", "the algorithm is not push-sum"),
        (config.compression == "none", "messages are compressed"),
        (config.precision in ("auto", "float64"), "the gossip precision is not float64"),
        (not config.algorithm_options, "the algorithm has options"),
        (not config.privacy.enabled, "privacy is on"),
        (config.rounds <= SEQ_SLACK, f"more than {SEQ_SLACK} rounds"),
        (network.scheme == "column-stochastic", "the weights are not column-stochastic"),
        (config.mixing_steps in ("auto", 1), "the agents take several gossip steps a round"),
    ]
    return [why for ok, why in settings if not ok]


def batched_refusal(config: RunConfig, network: Network) -> str | None:
    """Why ``config`` cannot run batched (None: it can): the workload of
    :func:`workload_refusals` on a network whose links decide drops in batch
    (:meth:`Network.message_drops`: the static one) and whose graph never changes (a
    periodic one is fine)."""
    settings = [
        (network.message_drops() is not None, "the links decide drops one by one"),
        (not network.time_varying and not network.round_driven, "the graph changes"),
    ]
    reasons = [why for ok, why in settings if not ok] + workload_refusals(config, network)
    return "; ".join(reasons) or None


@dataclass
class _Phase:
    """One phase of the graph: its edges among all, and every node's weights."""

    on: np.ndarray  # which edges (of _Edges) the phase has
    share: np.ndarray  # each node's share per out-edge, and its self weight
    #: What a starved node keeps: its self weight plus its shares (``kept_weight``, the sum
    #: the agent's hold-back makes).
    keep: np.ndarray


def _phase(graph: Graph, round_index: int, n: int, union_keys: np.ndarray) -> _Phase:
    src, dst = graph.edges(round_index)
    on = np.zeros(union_keys.shape[0], dtype=bool)
    on[np.searchsorted(union_keys, src * n + dst)] = True
    degree = np.bincount(src, minlength=n)
    # Column-stochastic weights, as the dense and sparse mixing matrices both give them.
    share = 1.0 / (degree + 1.0)
    kept = {int(d): kept_weight(1.0 / (d + 1.0), [1.0 / (d + 1.0)] * int(d))
            for d in np.unique(degree)}  # fmt: skip
    keep = np.array([kept[int(d)] for d in degree]) if n else np.ones(0)
    return _Phase(on, share, keep)


@dataclass
class _Edges:
    """The edges of every phase, sender-major: who, and the link's key."""

    src: np.ndarray
    dst: np.ndarray
    keys: np.ndarray
    #: ``inbox @ v`` sums ``v`` over each receiver's in-edges in sender order.
    inbox: csr_array


class BatchedPushSum:
    """Every agent of an in-process consensus fleet in arrays (see the module docstring).

    Parameters
    ----------
    config:
        The run (``batched_refusal(config, network)`` must be None).
    network:
        Its network (the drops of its links).
    graph:
        The gossip graph.
    ids:
        Agent ids, in index order.
    sink:
        Where each agent's round records go.
    """

    def __init__(
        self,
        config: RunConfig,
        network: Network,
        graph: Graph,
        ids: list[str],
        sink: StatsSink | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        refusal = batched_refusal(config, network)
        if refusal is not None:
            raise ValueError(f"this run cannot be batched: {refusal}")
        self.config, self.ids, self.sink, self.clock = config, ids, sink, clock
        self.reports = config.agent_settings().reports
        n = self.n = len(ids)
        drops = network.message_drops()
        assert drops is not None  # batched_refusal said so
        self.drops: BatchedDrops = drops
        options = parse_options(ConsensusOptions, config.task.options, "consensus")
        self.x = np.stack([consensus_vector(config.seed, i, options).numpy() for i in range(n)])
        self.y = np.ones(n)
        # Every edge of any phase, sender-major; each phase marks its own.
        src, dst = adjacency_edges(graph.union() if graph.period > 1 else graph.phases[0])
        m = src.shape[0]
        inbox = csr_array(
            (np.ones(m), (dst, np.arange(m))), shape=(n, m)
        )  # columns within a row stay in sender order (src is sorted)
        self.edges = _Edges(src, dst, drops.link_keys(ids, src, dst), inbox)
        self.phases = [_phase(graph, r, n, src * n + dst) for r in range(graph.period)]
        self.sigma_x = np.zeros((m, self.x.shape[1]))
        self.sigma_y = np.zeros(m)
        self.sent = np.zeros(m, dtype=np.int64)  # messages on the edge so far (shaper index)
        self.seq = np.zeros(m, dtype=np.int64)
        self.base = np.zeros(m, dtype=np.int64)  # the latest acknowledged seq
        self.counters = np.zeros((n, 4), dtype=np.int64)  # sent, bytes, dropped, received
        self.sizes = WireSizes(config, ids, self.x.shape[1])
        self.started = clock()

    def begin(self) -> None:
        """Report round 0 (the initial state), as every agent does."""
        self.started = self.clock()
        self.report(0)

    def round(self, round_index: int) -> None:
        """Every agent's push, then every agent's mix."""
        e = self.edges
        phase = self.phases[round_index % len(self.phases)]
        starving = starved(self.y)
        giving = phase.on & ~starving[e.src]
        weight = np.where(giving, phase.share[e.src], 0.0)
        # share: every edge of the phase takes its share of the sender's (x, y)
        for lo in range(0, e.src.shape[0], BLOCK_EDGES):
            hi = min(lo + BLOCK_EDGES, e.src.shape[0])
            w, senders = weight[lo:hi], e.src[lo:hi]
            block = self.sigma_x[lo:hi]
            block += self.x[senders] * w[:, None]
            self.sigma_y[lo:hi] += w * self.y[senders]
        kept = np.where(starving, phase.keep, phase.share)
        self.x *= kept[:, None]
        self.y *= kept
        # messages: every edge of the phase, and any edge that still owes weight (off this
        # phase, or its sender starved)
        active = np.flatnonzero(flushes(giving, self.sigma_y))
        index = self.sent[active]
        self.sent[active] += 1
        self.seq[active] += numbered(self.seq[active], self.base[active])
        dropped = self.drops.dropped(e.keys[active], round_index, index)
        src = e.src[active]
        nbytes = self.sizes.of(src, e.dst[active], round_index, self.seq[active],
                               self.base[active])  # fmt: skip
        n = self.n
        self.counters[:, 0] += np.bincount(src, minlength=n)
        self.counters[:, 1] += np.bincount(src, weights=nbytes, minlength=n).astype(np.int64)
        self.counters[:, 2] += np.bincount(src[dropped], minlength=n)
        delivered = active[~dropped]
        self.counters[:, 3] += np.bincount(e.dst[delivered], minlength=n)
        # deliveries: each receiver adds the running sums that reached it, in sender order;
        # the acknowledgement moves the edge's base to this message, its sum back to zero
        # (a dropped edge's entry weighs 0: it adds +0.0, which changes no sum, and no
        # edges-by-dimension temporary is made)
        landed = np.zeros(e.src.shape[0])
        landed[delivered] = 1.0
        inbox = csr_array((landed[e.inbox.indices], e.inbox.indices, e.inbox.indptr),
                          shape=e.inbox.shape)  # fmt: skip
        pending_x = inbox @ self.sigma_x
        pending_y = inbox @ self.sigma_y
        assert rebases(self.seq[delivered], self.base[delivered]).all()  # acks are inline
        self.sigma_x[delivered] = 0.0
        self.sigma_y[delivered] = 0.0
        self.base[delivered] = self.seq[delivered]
        # mix
        self.x += pending_x
        self.y += pending_y
        if self.reports(round_index):
            self.report(round_index)

    def report(self, round_index: int) -> list[RoundRecord]:
        """Every agent's record of ``round_index``, handed to the sink."""
        estimates = self.x / self.y[:, None]
        wall = self.clock() - self.started
        final = round_index == self.config.rounds
        seed, records = self.config.seed, []
        for i, agent_id in enumerate(self.ids):
            sent, nbytes, dropped, received = (int(v) for v in self.counters[i])
            counters = Counters(bytes_sent=nbytes, messages_sent=sent, messages_dropped=dropped,
                                messages_received=received)  # fmt: skip
            record = RoundRecord(
                agent_id=agent_id, round=round_index, wall_s=wall, metrics={},
                scalars={"weight": float(self.y[i])}, final=final,
                estimate=probe_estimate(estimates[i], seed), counters=counters,
            )  # fmt: skip
            if self.sink is not None:
                self.sink.record(record)
            records.append(record)
        return records


class WireSizes:
    """Bytes each of a consensus fleet's push-sum messages (vectors of ``dim``) takes on the
    wire (:func:`wire_bytes`), by what decides them: the ids' lengths and the bit lengths of
    round, seq, base and epoch."""

    def __init__(self, config: RunConfig, ids: list[str], dim: int) -> None:
        settings = config.agent_settings()
        task = load_task("consensus", TaskContext(0, len(ids), config.seed, torch.device("cpu"),
                                                  settings.task.options))  # fmt: skip
        digest = fleet_digest(task, task.initial_parameters())
        codec = resolve_codec(settings, torch.float64)
        self.ids = ids
        self.lengths = np.array([len(i.encode()) for i in ids], dtype=np.int64)
        if self.lengths.max() >= 1 << 12:
            raise ValueError("agent ids of 4,096 bytes or more")
        self.vector = torch.zeros(dim, dtype=torch.float64)
        self.encoded = codec.encode(self.vector)
        self.digest, self.codec = digest, codec
        self.known: dict[tuple[int, ...], int] = {}

    def of(self, src: np.ndarray, dst: np.ndarray, round_index: int, seq: np.ndarray,
           base: np.ndarray) -> np.ndarray:  # fmt: skip
        """Every message's bytes (``seq``, ``base`` are below 2**32)."""
        # one integer per message from what decides its size (each part below 2**12)
        key = self.lengths[src] << 36 | self.lengths[dst] << 24 | _bits(seq) << 12 | _bits(base)
        unique, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        sizes = np.empty(unique.shape[0], dtype=np.int64)
        for k, at in enumerate(first.tolist()):
            sizes[k] = self.message(int(src[at]), int(dst[at]), round_index, int(seq[at]),
                                    int(base[at]), STATIC_EPOCH)  # fmt: skip
        out: np.ndarray = sizes[inverse.reshape(-1)]
        return out

    def message(self, i: int, j: int, round_index: int, seq: int, base: int, epoch: int) -> int:
        """The bytes of one message from agent ``i`` to ``j`` (assignment ``epoch``)."""
        key = (len(self.ids[i]), len(self.ids[j]), round_index.bit_length(), seq.bit_length(),
               base.bit_length(), epoch.bit_length())  # fmt: skip
        size = self.known.get(key)
        if size is None:
            sender = Sender(self.ids[i], "push-sum", self.digest, "", self.codec)
            payload = Payload(self.vector, {"y": 1.0}, seq, base, encoded=self.encoded)
            message = gossip_message(sender, round_index, self.ids[j], payload,
                                     epoch=epoch, lineage=0)  # fmt: skip
            size = self.known[key] = wire_bytes(message)
        return size


def _bits(values: np.ndarray) -> np.ndarray:
    """``int.bit_length`` of each non-negative value below 2**32."""
    v = values.astype(np.uint64)
    bits = np.zeros(v.shape, dtype=np.int64)
    for shift in (16, 8, 4, 2, 1):
        big = v >= np.uint64(1 << shift)
        bits[big] += shift
        v = np.where(big, v >> np.uint64(shift), v)
    return bits + (v > 0)
