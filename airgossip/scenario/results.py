"""A run's results: the typed model behind ``results.json``, the fleet figures computed from
the agents' round records, and the plot.

:class:`RunResults` is what every fleet writes and every reader (comparisons, the
coordinator's collected results) reads; optional figures that a run does not have are left
out of the file rather than written as null, so the schema is the same whichever fleet or
network made it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, JsonValue, ValidationError

from airgossip.common.security.private_files import open_private, write_private
from airgossip.common.topology.switching import consensus_distance
from airgossip.edge.observability.stats import RoundRecord
from airgossip.edge.privacy.figures import Spent


class _Figures(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RoundFigures(_Figures):
    """The fleet after one round (every agent that reported it)."""

    round: int
    #: Seconds the agents took to reach this round, from the start of their first (the
    #: slowest agent's; virtual time in the virtual mode): start-up is not in it, the run's
    #: whole time is ``RunResults.total_wall_s``. Schema 1 called it ``wall_s``.
    train_wall_s: float = Field(0.0, validation_alias=AliasChoices("train_wall_s", "wall_s"))
    mean_accuracy: float | None = None
    min_accuracy: float | None = None
    max_accuracy: float | None = None
    consensus_distance: float | None = None
    bytes_sent: int = 0
    messages_sent: int = 0
    #: Messages that did not arrive: dropped by a link or failed.
    messages_dropped: int = 0
    agents_reporting: int = 0
    #: Tasks that report a test loss.
    mean_loss: float | None = None
    #: Pure-gossip tasks with an exact answer (``consensus``).
    relative_error: float | None = None
    #: Wireless networks: the fleet's links when the round was recorded.
    radio_links: float | None = None
    gossip_links: float | None = None
    strongly_connected: float | None = None
    #: Messages lost over messages sent during the round.
    drop_rate: float | None = None
    #: Runs with ``[privacy]``: the most epsilon any agent has spent (at the run's delta).
    privacy_epsilon: float | None = None
    #: Runs whose ``[[device_classes]]`` draw power: joules the agents had spent, on average
    #: and at most (airgossip.edge.energy), those whose battery ran out included.
    mean_energy_j: float | None = None
    max_energy_j: float | None = None
    #: ... and how many of them had spent their battery by then (they left the fleet).
    agents_depleted: int | None = None


class MomentFigures(_Figures):
    """The fleet at one moment of its agents' clocks (every agent's latest report)."""

    time_s: float
    mean_accuracy: float | None = None
    mean_energy_j: float | None = None


class FinalFigures(RoundFigures):
    """Every agent's last record."""

    complete: bool = False


_Row = TypeVar("_Row", bound=RoundFigures)


class WirelessFigures(_Figures):
    """What a wireless network adds to a run's results."""

    scenario: str
    emulated_s: float
    graph_epochs: int
    mean_radio_links: float | None
    mean_gossip_links: float | None
    strongly_connected_share: float | None
    links_log: str | None = None
    links_log_steps: int | None = None
    messages_log: str | None = None


class KernelFigures(_Figures):
    """What the kernel did to the packets of a run whose links it shaped (namespaces,
    containers): loss there is a packet drop rate, and TCP resends what was dropped, so
    messages arrive late rather than not at all. ``kernel.json`` has every link."""

    #: Packets of the agents' traffic the shaped links saw, and how many they dropped.
    packets_seen: int
    packets_dropped: int
    #: ``packets_dropped / packets_seen`` (None when no packet was seen).
    drop_rate: float | None
    #: Links measured (directed, sender to receiver).
    links: int

    def describe(self) -> str:
        """``the kernel dropped 210 of 2,345 packets (9.0%), TCP resent them``."""
        rate = "" if self.drop_rate is None else f" ({self.drop_rate:.1%})"
        return (
            f"the kernel dropped {self.packets_dropped:,} of {self.packets_seen:,} packets"
            f"{rate}, TCP resent them"
        )


class PairwiseFigures(_Figures):
    """Network DP's guarantee between every ordered pair of agents at the end of a run:
    epsilon of what agent ``u``'s data tells a curious agent ``v``, over all pairs and by
    their distance in the graph (hops from ``u`` to ``v``)."""

    min: float
    mean: float
    max: float
    by_distance: dict[str, float]
    #: False when the run was too long to factorise its views: local DP stands in.
    exact: bool


class PrivacyFigures(_Figures):
    """What a run with ``[privacy]`` adds to its results: the noise it resolved to and the
    guarantee the agents spent (``docs/privacy.md`` says what each one means)."""

    mechanism: str
    delta: float
    accountant: str
    sample_rate: float
    max_grad_norm: float
    #: What each agent's optimizer added per step, over max_grad_norm.
    noise_multiplier: float
    #: Rounds per private step (the others only gossip).
    gossip_rounds: int = 1
    #: Cancelling: each pairwise mask, over max_grad_norm.
    mask_multiplier: float | None = None
    #: Cancelling: whom epsilon is against (``curious-agent`` or ``eavesdropper``).
    adversary: str | None = None
    #: The Gaussian mechanism the accountant composed per step (dp-sgd: the agent's own
    #: noise; central: the curator's; cancelling: the worst agent's effective noise
    #: against ``adversary``).
    accounted_multiplier: float | None = None
    #: The most any agent spent; network DP: the worst pair.
    epsilon: float | None = None
    #: Network DP: the mean over pairs.
    epsilon_mean: float | None = None
    budget_epsilon: float | None = None
    #: Agents the budget stopped from training.
    exhausted_agents: int = 0
    pairwise: PairwiseFigures | None = None


class ResolvedFigures(_Figures):
    """What a run resolved beside its settings, which ``results.json``'s ``config`` carries:
    its first gossip graph's figures (and name, where the settings do not say it: a wireless
    channel's graph, a coordinator's k-out) and the rounds a schedule switched graphs at."""

    topology: str | None = None
    lambda2: float | None = None
    topology_period: int | None = None
    edges_per_round: int | float | None = None
    initial_strongly_connected: bool | None = None
    switched_at: list[int] | None = None


class RunIdentity(_Figures):
    """What a coordinator adds to the results of the run it held: which run, when, and how
    each agent ended (``finished``, ``dead``, ``left``, or ``alive`` if interrupted)."""

    id: str
    started_unix: float | None = None
    ended_unix: float | None = None
    agents: dict[str, str] = {}
    #: The messages ``final`` counts as lost, by cause: dropped by an emulated link, or
    #: failed (refused by the receiver, or it could not be reached).
    messages_emulated_drops: int = 0
    messages_failed: int = 0


#: Version of ``results.json``'s layout: 1 (no ``schema_version`` key) named each round's
#: time ``wall_s``; 2 names it ``train_wall_s`` beside the run's ``total_wall_s``. Files of
#: either version are read.
SCHEMA_VERSION = 2


class RunResults(_Figures):
    """Everything ``results.json`` holds."""

    #: The layout this file follows (:data:`SCHEMA_VERSION` when written here).
    schema_version: int = 1

    #: The run's settings and what it resolved (an airgossip run's: see
    #: ``airgossip.node.results_writer.ResultsConfig``), or another system's (a baseline's).
    config: dict[str, JsonValue]
    rounds: list[RoundFigures]
    final: FinalFigures
    total_wall_s: float = 0.0
    interrupted: bool = False
    versions: dict[str, str] = {}
    wireless: WirelessFigures | None = None
    #: Runs a coordinator collected (agents started by hand): the run's id and its agents.
    run: RunIdentity | None = None
    privacy: PrivacyFigures | None = None
    #: Packet drops of kernel-shaped links, apart from message losses (``final``).
    kernel: KernelFigures | None = None
    #: Fleets whose agents go at their own pace or on uneven devices: the fleet over time
    #: (:func:`over_time`, at most :data:`TIMELINE_POINTS` moments), where a round's figures
    #: mix agents that got there at different times.
    timeline: list[MomentFigures] | None = None

    def to_json(self) -> dict[str, JsonValue]:
        """The JSON form: figures a run does not have are left out, NaN and infinity
        become null (JSON has neither)."""
        data: dict[str, JsonValue] = {"schema_version": SCHEMA_VERSION}
        data.update(_clean(self.model_dump(mode="json", exclude_unset=True)))
        data["schema_version"] = SCHEMA_VERSION
        return data

    def write(self, path: Path) -> None:
        """Write ``path`` whole or not at all (a temporary file renamed over it): whoever
        waits for the file never reads it half written."""
        write_private(path, json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> RunResults:
        """Read a ``results.json``; ``ValueError`` naming the file and what is wrong."""
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"{path} does not exist") from None
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"cannot read {path}: {err}") from None
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{path} is not a results file: {where}: {first['msg']}") from None


def relative_error(estimates: list[np.ndarray], reference: np.ndarray) -> float | None:
    """Max over agents of ``||z_i - reference|| / ||reference||``."""
    if not estimates:
        return None
    norm = float(np.linalg.norm(reference)) or 1.0
    return float(np.linalg.norm(np.stack(estimates) - reference, axis=1).max() / norm)


def _figures(
    records: list[RoundRecord], reference: np.ndarray | None, row: type[_Row], **fixed: object
) -> _Row:
    """The fleet's figures over ``records`` (one per agent) as a ``row``; ``fixed``: its
    other fields (the round)."""
    accuracies = [r.metrics["accuracy"] for r in records if "accuracy" in r.metrics]
    estimates = [r.estimate for r in records if r.estimate is not None]
    figures = row.model_validate({
        **fixed,
        "train_wall_s": round(max(r.wall_s for r in records), 4),
        "mean_accuracy": float(np.mean(accuracies)) if accuracies else None,
        "min_accuracy": float(np.min(accuracies)) if accuracies else None,
        "max_accuracy": float(np.max(accuracies)) if accuracies else None,
        "consensus_distance": consensus_distance(estimates),
        "bytes_sent": sum(r.counters.bytes_sent for r in records),
        "messages_sent": sum(r.counters.messages_sent for r in records),
        "messages_dropped": sum(r.counters.messages_lost for r in records),
        "agents_reporting": len(records),
    })  # fmt: skip
    # Figures a run does not have stay unset, and out of results.json.
    losses = [r.metrics["loss"] for r in records if "loss" in r.metrics]
    if losses:
        figures.mean_loss = float(np.mean(losses))
    spent = [s for r in records if (s := Spent.from_metrics(r.metrics)) is not None]
    if spent:  # infinite (no noise) is written as null
        figures.privacy_epsilon = max(s.epsilon for s in spent)
    if reference is not None:
        figures.relative_error = relative_error(estimates, reference)
    energy = [r.metrics["energy_j"] for r in records if "energy_j" in r.metrics]
    if energy:
        figures.mean_energy_j = float(np.mean(energy))
        figures.max_energy_j = float(np.max(energy))
        figures.agents_depleted = sum(1 for r in records if _depleted(r))
    return figures


def _depleted(record: RoundRecord) -> bool:
    """The agent had spent its battery (and left the fleet) when it made ``record``."""
    return record.metrics.get("battery_left_j", 1.0) <= 0.0


#: The most moments ``results.json``'s ``timeline`` keeps.
TIMELINE_POINTS = 200


def over_time(records: Mapping[str, Iterable[RoundRecord]]) -> list[MomentFigures]:
    """The fleet after each report, in the order of the agents' clocks (``wall_s``): what a
    fleet whose agents go at their own pace (``pace = "async"``) has reached by a time, where
    a round's figures mix agents that got there at different times."""
    latest: dict[str, RoundRecord] = {}
    events = sorted(
        ((r.wall_s, r.round, agent_id, r) for agent_id, rs in records.items() for r in rs),
        key=lambda e: (e[0], e[1], e[2]),
    )
    moments: list[MomentFigures] = []
    accuracy = energy = 0.0
    with_accuracy = with_energy = 0
    for time_s, _, agent_id, record in events:
        before = latest.get(agent_id)
        if before is not None:
            if "accuracy" in before.metrics:
                accuracy -= before.metrics["accuracy"]
                with_accuracy -= 1
            if "energy_j" in before.metrics:
                energy -= before.metrics["energy_j"]
                with_energy -= 1
        latest[agent_id] = record
        if "accuracy" in record.metrics:
            accuracy += record.metrics["accuracy"]
            with_accuracy += 1
        if "energy_j" in record.metrics:
            energy += record.metrics["energy_j"]
            with_energy += 1
        moments.append(MomentFigures.model_construct(  # built from figures already checked
            time_s=time_s,
            mean_accuracy=accuracy / with_accuracy if with_accuracy else None,
            mean_energy_j=energy / with_energy if with_energy else None,
        ))  # fmt: skip
    return moments


def time_to_accuracy(
    records: Mapping[str, Iterable[RoundRecord]], target: float
) -> MomentFigures | None:
    """The first moment the fleet's mean accuracy (every agent's latest report) reaches
    ``target`` (None: it never did), with the mean energy spent by then."""
    for moment in over_time(records):
        if moment.mean_accuracy is not None and moment.mean_accuracy >= target:
            return moment
    return None


def summarise(
    records: Mapping[str, Iterable[RoundRecord]],
    *,
    reference: np.ndarray | None = None,
    config: dict[str, JsonValue] | None = None,
) -> RunResults:
    """Per-round and final fleet figures.

    Parameters
    ----------
    records:
        Every agent's records, by agent id.
    reference:
        The exact answer for pure-gossip tasks (``consensus``): adds ``relative_error``.
    config:
        The resolved config the results carry.
    """
    records = {agent_id: list(rs) for agent_id, rs in records.items()}  # read twice
    by_round: dict[int, dict[str, RoundRecord]] = {}
    last: dict[str, RoundRecord] = {}
    for agent_id, agent_records in records.items():
        for record in agent_records:
            by_round.setdefault(record.round, {})[agent_id] = record
            if agent_id not in last or record.round >= last[agent_id].round:
                last[agent_id] = record
    rounds = [
        _figures(list(by_round[r].values()), reference, RoundFigures, round=r)
        for r in sorted(by_round)
    ]
    final_round = max((r.round for r in last.values()), default=0)
    complete = bool(last) and all(r.final for r in last.values())
    # The final figures are those of the agents that finished the run (of all, where none
    # did): one that died or was left out at round 3 is not the fleet's final accuracy. It
    # is counted in ``complete`` (false) and in its rounds' figures. One whose battery ran
    # out made its last record final as it left: it counts in ``agents_depleted``, not in
    # the final figures.
    finished = [r for r in last.values() if r.final and not _depleted(r)] or list(last.values())
    if last:
        final = _figures(finished, reference, FinalFigures, round=final_round,
                         complete=complete)  # fmt: skip
    else:  # nothing reported: a final row with the round and nothing else
        final = FinalFigures(round=final_round, complete=complete)
    if final.mean_energy_j is not None:  # counted over every agent, not the finishers only
        final.agents_depleted = sum(1 for r in last.values() if _depleted(r))
    results = RunResults(config=config or {}, rounds=rounds, final=final)
    settings = config or {}
    if settings.get("pace") == "async" or settings.get("device_classes"):
        moments = over_time(records)
        step = max(1, len(moments) // TIMELINE_POINTS)
        kept = moments[step - 1 :: step] if len(moments) > TIMELINE_POINTS else moments
        if moments and kept[-1] is not moments[-1]:
            kept.append(moments[-1])
        results.timeline = kept
    return results


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def plot_results(path: Path, results: RunResults, title: str) -> None:
    """PNG with accuracy (mean, min-max band) and consensus distance per round, and, for
    runs whose rounds hold them, the drop rate and link counts (wireless networks) and the
    mean accuracy against the mean energy an agent spent (device classes that draw power)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results.rounds
    links = any(r.drop_rate is not None or r.radio_links is not None for r in rows)
    energy = [
        (r.mean_energy_j, r.mean_accuracy)
        for r in rows
        if r.mean_energy_j is not None and r.mean_accuracy is not None
    ]
    panels = 2 + links + bool(energy)
    fig, axes = plt.subplots(1, panels, figsize=(5.4 * panels + 0.2, 4.2))
    left, right = axes[0], axes[1]
    acc = [
        (r.round, r.mean_accuracy, r.min_accuracy, r.max_accuracy)
        for r in rows
        if r.mean_accuracy is not None
    ]
    if acc:
        xs, mean, low, high = (list(c) for c in zip(*acc, strict=True))
        left.fill_between(xs, low, high, alpha=0.25, label="min-max over agents")
        left.plot(xs, mean, label="mean")
        left.set_ylabel("test accuracy")
        left.set_ylim(0, 1)
    else:
        # No accuracy: the error to the exact answer (consensus), else the mean test loss.
        for key, label in (
            ("relative_error", "max relative error to the true average"),
            ("mean_loss", "mean test loss"),
        ):
            points = [(r.round, getattr(r, key)) for r in rows if getattr(r, key)]
            if points:
                left.semilogy([p[0] for p in points], [p[1] for p in points], label=label)
                left.set_ylabel(label)
                break
    left.set_xlabel("round")
    if left.get_legend_handles_labels()[0]:
        left.legend(loc="best")
    left.grid(alpha=0.3)
    # A log axis cannot show exact zeros (identical starting models): leave them out.
    dist = [(r.round, r.consensus_distance) for r in rows if r.consensus_distance]
    if dist:
        right.semilogy([d[0] for d in dist], [d[1] for d in dist])
    right.set_xlabel("round")
    right.set_ylabel("consensus distance")
    right.grid(alpha=0.3)
    if links:
        _plot_links(axes[2], rows)
    if energy:
        ax = axes[-1]
        ax.plot([e[0] for e in energy], [e[1] for e in energy], marker=".")
        ax.set_xlabel("mean energy spent per agent (J)")
        ax.set_ylabel("mean test accuracy")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    # Fixed margins that fit the labels: tight_layout measured every tick label's extent
    # first, as long as drawing the figure (0.3-0.5 s a run).
    if panels > 2:
        fig.subplots_adjust(left=0.055, right=0.945, bottom=0.12, top=0.88, wspace=0.34)
    else:
        fig.subplots_adjust(left=0.08, right=0.985, bottom=0.12, top=0.88, wspace=0.3)
    save_figure(fig, path)
    plt.close(fig)


def save_figure(fig: Any, path: Path) -> None:
    """Save a matplotlib figure to ``path`` as a private file (0600), in the format its
    suffix names."""
    with open_private(path, "wb") as handle:
        fig.savefig(handle, dpi=110, format=path.suffix.lstrip(".") or "png")


def _plot_links(ax: Any, rows: list[RoundFigures]) -> None:
    """Drop rate per round (left axis) and the fleet's radio and gossip links (right axis)."""
    drops = [(r.round, r.drop_rate) for r in rows if r.drop_rate is not None]
    if drops:
        ax.plot([d[0] for d in drops], [d[1] for d in drops], color="tab:red", label="drop rate")
    ax.set_ylim(0, 1)
    ax.set_xlabel("round")
    ax.set_ylabel("drop rate (lost / sent in the round)")
    ax.grid(alpha=0.3)
    counts = ax.twinx()
    for key, label, style in (("radio_links", "radio links", "-"),
                              ("gossip_links", "gossip links", "--")):  # fmt: skip
        points = [(r.round, getattr(r, key)) for r in rows if getattr(r, key) is not None]
        if points:
            counts.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
    counts.set_ylim(bottom=0)
    counts.set_ylabel("directed links (median over agents)")
    handles = ax.get_legend_handles_labels()[0] + counts.get_legend_handles_labels()[0]
    if handles:
        ax.legend(handles=handles, loc="best")
