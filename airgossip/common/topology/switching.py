"""Switching the gossip graph while the fleet learns: a validated schedule and its decisions.

A fleet that starts dense and ends sparse pays for the dense graph only while the replicas
are far apart (Xie et al., arXiv 2509.12213, switch graphs during decentralized SGD); the
reverse keeps early rounds cheap. The schedule is a list of named topologies and when to move
to the next one:

- by round (``at_rounds``): ``topologies[k + 1]`` from round ``at_rounds[k]`` on;
- adaptively (``trigger``): when a fleet figure crosses ``threshold`` for ``window``
  reported rounds in a row, after at least ``min_rounds`` rounds on the current graph:
  ``consensus-distance-below`` (the replicas agree well enough: go sparser),
  ``consensus-distance-above`` (they drift apart: go denser), or ``loss-plateau`` (the mean
  loss improved by less than ``threshold``, relatively, over the last ``window`` reports).

:class:`TopologySwitcher` is pure: it is told the figures after each round and answers with
the next graph when a switch is due. Whoever sees every agent's rounds (a fleet that runs
its agents in one process, or the coordinator of agent processes and devices) measures the
figures with :func:`fleet_figures`, turns a new graph into assignments with a higher epoch
(:func:`switched_assignments`), and every agent installs its own with
``Agent.set_assignment``, keeping its gossip state. The old peers stay in each
directory (:func:`~airgossip.common.topology.assignment.transition`), so push-sum weight and
unacknowledged blocks still owed on edges that left the graph are delivered and the fleet's
totals stay exact across switches.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from airgossip.common.options import validate_options
from airgossip.common.topology.assignment import Assignment, assignments_for_graph, transition
from airgossip.common.topology.graphs import TOPOLOGIES, Graph, build_graph

Trigger = Literal["consensus-distance-below", "consensus-distance-above", "loss-plateau"]


class SwitchingSettings(BaseModel):
    """``[switching]``: the graphs a fleet goes through and when it moves to the next one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topologies: list[str] = Field(min_length=2, description="the graphs, in the order used")
    at_rounds: list[int] | None = Field(
        None, description="by round: the first round on each graph after the first"
    )
    trigger: Trigger | None = Field(None, description="adaptive: the figure that decides")
    threshold: float | None = Field(None, gt=0, description="adaptive: where the figure switches")
    window: int = Field(3, ge=1, le=10_000, description="adaptive: reports the condition holds")
    min_rounds: int = Field(1, ge=1, description="adaptive: least rounds on a graph")

    @model_validator(mode="after")
    def _consistent(self) -> SwitchingSettings:
        for name in self.topologies:
            if name == "edges" or name not in TOPOLOGIES:
                allowed = ", ".join(t for t in TOPOLOGIES if t != "edges")
                raise ValueError(f"unknown topology '{name}'; choose from: {allowed}")
        if (self.at_rounds is None) == (self.trigger is None):
            raise ValueError(
                "give at_rounds (switch by round) or trigger (switch when a fleet figure "
                "crosses threshold), exactly one of them"
            )
        if self.at_rounds is not None:
            rounds = self.at_rounds
            if len(rounds) != len(self.topologies) - 1:
                raise ValueError(
                    f"{len(self.topologies)} topologies need {len(self.topologies) - 1} "
                    f"at_rounds (one per switch), got {len(rounds)}"
                )
            if rounds[0] < 2 or any(b <= a for a, b in itertools.pairwise(rounds)):
                raise ValueError(
                    f"at_rounds must be strictly increasing rounds from 2, got {rounds}"
                )
        elif self.threshold is None:
            raise ValueError(f"trigger '{self.trigger}' needs a threshold")
        return self


def parse_switching(options: Mapping[str, Any]) -> SwitchingSettings:
    """Validate a ``[switching]`` table; ``ValueError`` starting ``switching:`` naming every
    problem and what is allowed."""
    return validate_options(SwitchingSettings, options, "switching")


@dataclass(frozen=True)
class FleetFigures:
    """What the fleet measured after one round (``None``: not measured that round)."""

    round: int
    consensus_distance: float | None = None
    loss: float | None = None


def consensus_distance(estimates: Sequence[np.ndarray]) -> float | None:
    """Mean over agents of ``||z_i - mean z|| / ||mean z||`` (None with no estimates)."""
    if not estimates:
        return None
    stack = np.stack(estimates)
    mean = stack.mean(axis=0)
    norm = float(np.linalg.norm(mean))
    spread = np.linalg.norm(stack - mean, axis=1).mean()
    return float(spread / norm) if norm > 0 else float(spread)


class ReportedRound(Protocol):
    """What a schedule reads of an agent's report of a round (an
    :class:`~airgossip.edge.observability.stats.RoundRecord`, which the topology room does not
    import: the records are the observability room's, above it)."""

    @property
    def estimate(self) -> np.ndarray | None: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...


def fleet_figures(round_index: int, records: Sequence[ReportedRound], agents: int) -> FleetFigures:
    """What a switcher is told after ``round_index``: the consensus distance of the reported
    estimates and the mean loss, both only when all ``agents`` reported the round (a figure
    over part of the fleet is not the fleet's).

    ``records``: the records reported for ``round_index`` (none when it was not an
    evaluated round). An estimate that is a count sketch (large models, see
    :func:`airgossip.edge.observability.stats.probe_estimate`) gives an estimate of the distance.
    """
    estimates = [r.estimate for r in records if r.estimate is not None]
    losses = [r.metrics["loss"] for r in records if "loss" in r.metrics]
    complete = len(estimates) == agents
    return FleetFigures(
        round_index,
        consensus_distance(estimates) if complete else None,
        float(np.mean(losses)) if complete and losses else None,
    )


class TopologySwitcher:
    """Decides, round by round, when the fleet moves to the next graph of its schedule.

    Parameters
    ----------
    settings:
        The schedule.
    n:
        Fleet size.
    seed:
        Seed of random topologies (``erdos-renyi``).

    Raises
    ------
    TopologyError
        When a graph of the schedule cannot be built (all are built up front).
    """

    def __init__(self, settings: SwitchingSettings, n: int, *, seed: int = 0) -> None:
        self.settings = settings
        self.graphs = tuple(build_graph(name, n, seed=seed) for name in settings.topologies)
        self.stage = 0
        #: The first round on each graph after the first.
        self.switched_at: list[int] = []
        self._entered = 0  # the last round on the previous graph
        self._streak = 0
        self._losses: list[float] = []

    def restore(self, switched_at: Sequence[int]) -> None:
        """Take back the switches made so far (a coordinator restarted from its database):
        the stage after them, on its graph since round ``switched_at[-1]``. An adaptive
        trigger's streak starts again: feed it the figures of the rounds since then, in order,
        to have it exactly as it was.

        Raises
        ------
        ValueError
            When ``switched_at`` holds more switches than the schedule has, or rounds that
            do not increase.
        """
        rounds = [int(r) for r in switched_at]
        if len(rounds) >= len(self.graphs) or any(b <= a for a, b in itertools.pairwise(rounds)):
            raise ValueError(
                f"switches at rounds {rounds} do not fit a schedule of {len(self.graphs)} graphs"
            )
        self.stage = len(rounds)
        self.switched_at = rounds
        self._entered = rounds[-1] - 1 if rounds else 0
        self._streak = 0
        self._losses = []

    @property
    def graph(self) -> Graph:
        """The graph in use now."""
        return self.graphs[self.stage]

    @property
    def finished(self) -> bool:
        return self.stage == len(self.graphs) - 1

    def observe(self, figures: FleetFigures) -> Graph | None:
        """Take the figures after round ``figures.round``; the graph to use from the next
        round on when a switch is due, else None."""
        if self.finished or not self._due(figures):
            return None
        self.stage += 1
        self.switched_at.append(figures.round + 1)
        self._entered = figures.round
        self._streak = 0
        self._losses = []
        return self.graph

    def _due(self, figures: FleetFigures) -> bool:
        settings = self.settings
        if settings.at_rounds is not None:
            return figures.round + 1 >= settings.at_rounds[self.stage]
        threshold = settings.threshold
        assert threshold is not None
        if settings.trigger == "loss-plateau":
            if figures.loss is None or not math.isfinite(figures.loss):
                return False
            self._losses.append(figures.loss)
            window = self._losses[-settings.window - 1 :]
            if len(window) <= settings.window:
                return False
            gain = (window[0] - window[-1]) / abs(window[0]) if window[0] else 0.0
            holds = gain < threshold
        else:
            distance = figures.consensus_distance
            if distance is None or not math.isfinite(distance):
                return False
            below = settings.trigger == "consensus-distance-below"
            holds = distance < threshold if below else distance > threshold
            self._streak = self._streak + 1 if holds else 0
            holds = self._streak >= settings.window
        return holds and figures.round - self._entered >= settings.min_rounds


def switched_assignments(
    current: dict[str, Assignment],
    graph: Graph,
    addresses: dict[str, str],
    *,
    scheme: str = "column-stochastic",
    epoch: int | None = None,
) -> dict[str, Assignment]:
    """Every agent's assignment for ``graph`` at ``epoch`` (default: one above the highest
    in ``current``), with each agent's old peers kept (:func:`transition`) so what edges
    still owe arrives."""
    if epoch is None:
        epoch = max(a.epoch for a in current.values()) + 1
    new = assignments_for_graph(graph, addresses, epoch=epoch, scheme=scheme)
    return {
        agent: transition(current[agent], assignment) if agent in current else assignment
        for agent, assignment in new.items()
    }
