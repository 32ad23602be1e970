"""How an agent process drives its agent's rounds on the wall clock.

The :class:`~airgossip.edge.agent.agent.Agent` has the phases of a round and nothing of time;
in-process drivers call them in lock step or on a virtual clock. A process runs them here: it waits
for in-neighbours (bounded by ``wait_timeout_s``), writes checkpoints at their interval, and, when
it starts while its fleet is under way (a restart), rejoins at the fleet's round
(:mod:`airgossip.edge.agent.rejoin`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

from airgossip.edge.agent.agent import Agent
from airgossip.edge.agent.mixing_steps import StepWaits
from airgossip.edge.agent.rejoin import (
    LATE_WEIGHT,
    MIN_QUORUM,
    REJOIN_WAIT_S,
    fleet_round,
    rejoin_round,
)
from airgossip.edge.availability import OnlineSchedule

log = logging.getLogger("airgossip.edge.agent.agent")


class WallClockRunner:
    """Runs one agent's remaining rounds on the wall clock.

    ``stretch`` (1 or more) emulates a slower device: each local step is followed by a pause
    of ``stretch - 1`` times what the step took, so that it takes ``stretch`` times as long
    as on this machine (the agent still serves and absorbs messages meanwhile, as a slow
    device's network stack does). ``online`` emulates a device that is sometimes off
    (:mod:`airgossip.edge.availability`, times from the runner's start): before each round
    an agent that is off waits until it is on, refusing messages meanwhile.
    ``wait_timeout_s``: its longest wait for in-neighbours per round (default: its
    settings').
    """

    def __init__(
        self,
        agent: Agent,
        stretch: float = 1.0,
        online: OnlineSchedule | None = None,
        wait_timeout_s: float | None = None,
    ) -> None:
        if not stretch >= 1.0:
            raise ValueError(f"a step can be stretched, not shrunk: stretch {stretch} < 1")
        self.agent = agent
        self.stretch = stretch
        self.online = online
        self.wait_timeout_s = (
            agent.settings.wait_timeout_s if wait_timeout_s is None else wait_timeout_s
        )
        self._began = agent.clock()
        self._rejoining = False
        self.step_waits = StepWaits()

    def run(self) -> None:
        """Run the remaining rounds, reporting round 0 first (unless the agent resumed from a
        checkpoint); write a last checkpoint when it stops.

        After its first round, an agent that finds its fleet well ahead (it restarted while
        the fleet went on) skips ahead to its peers' round (see :meth:`catch_up`).
        """
        agent = self.agent
        if agent.round == 0:
            agent.begin()
        self._rejoining = True
        while agent.round < agent.settings.rounds and not agent.stopped:
            self.run_round(agent.round + 1)
            if agent.energy is not None and agent.energy.depleted:
                log.info(
                    "%s: battery spent (%.1f J) in round %d: it leaves the fleet",
                    agent.agent_id, agent.energy.total_j, agent.round,
                )  # fmt: skip
                break
            if self._rejoining:
                self.catch_up(wait_s=REJOIN_WAIT_S)
        if agent.checkpointer is not None:
            agent.checkpoint()

    def run_round(self, round_index: int) -> None:
        agent = self.agent
        self.wait_while_off()
        began = agent.clock()
        agent.local_step(round_index)
        if self.stretch > 1.0:
            self._wait(lambda: False, (self.stretch - 1.0) * (agent.clock() - began))
        if agent.energy is not None:
            agent.energy.computed(agent.clock() - began)
        times = [agent.clock()]  # when the round's gossip began, and each step ended
        for step in range(agent.mixing_steps):
            agent.push(round_index, step)
            self.wait_for_neighbours(round_index, step)
            agent.mix(round_index, step)
            times.append(agent.clock())
        agent.costs_measured(times[0] - began, [b - a for a, b in itertools.pairwise(times)])
        # A spent battery ends the agent's run here: its last report is final.
        depleted = agent.energy is not None and agent.energy.depleted
        if agent.report_due(round_index) or depleted:
            agent.report(round_index, final=depleted)
        if agent.checkpointer is not None and agent.checkpointer.due():
            agent.checkpoint()

    def wait_while_off(self) -> None:
        """An emulated device that is off now: wait until it is on, refusing messages."""
        online, agent = self.online, self.agent
        if online is None:
            return
        now = agent.clock() - self._began
        back = online.next_online(now)
        if back <= now:
            return
        log.info("%s: off for %.1f s (its device's availability)", agent.agent_id, back - now)
        agent.offline = True
        try:
            self._wait(lambda: False, back - now)
        finally:
            agent.offline = False

    def wait_for_neighbours(self, round_index: int, step: int = 0) -> None:
        """Wait (at most ``wait_timeout_s``) until this round's sends (of its gossip step
        ``step``) are done and in-neighbours are within ``staleness`` rounds
        (:meth:`~airgossip.edge.agent.agent.Agent.neighbours_ready`); a further step of the
        round then waits briefly for its in-neighbours' same step too (:class:`StepWaits`).

        On fast links that keeps agents near lock step; on slow ones the wait times out and
        sending overlaps with the next round's work. In the last round the agent waits for
        its in-neighbours' last messages too (no staleness), so that the final estimate
        holds everything they sent.
        """
        timeout, agent = self.wait_timeout_s, self.agent
        if timeout <= 0:
            return
        self._wait(lambda: agent.neighbours_ready(round_index, step), timeout)
        if step > 0:  # a further step: briefly, for the in-neighbours' same step
            began = agent.clock()
            heard = self._wait(
                lambda: agent.step_heard(round_index, step), self.step_waits.timeout(timeout)
            )
            self.step_waits.waited(agent.clock() - began, heard=heard)

    def _wait(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until ``ready()`` holds, re-checked whenever a push
        finishes or a message arrives, or until the agent stops; whether it holds."""
        agent = self.agent
        deadline = agent.clock() + timeout_s
        with agent.progress:
            while not agent.stopped:
                if ready():
                    return True
                remaining = deadline - agent.clock()
                if remaining <= 0:
                    return False
                agent.progress.wait(remaining)
        return False

    def rejoin(self, fleet: int) -> None:
        """Skip ahead to round ``fleet`` (where the fleet is, as its coordinator or peers
        say) when it is well ahead (:func:`~airgossip.edge.agent.rejoin.rejoin_round`)."""
        agent = self.agent
        target = rejoin_round(
            agent.round, fleet, rounds=agent.settings.rounds, staleness=agent.settings.staleness
        )
        if target is not None:
            fresh = "" if agent.holds_past else f", with weight {LATE_WEIGHT:g} (no checkpoint)"
            log.info(
                "%s: rejoining the fleet at round %d (it was at round %d)%s",
                agent.agent_id, target, agent.round, fresh,
            )  # fmt: skip
            agent.skip_to(target - 1)

    def catch_up(self, wait_s: float = 0.0) -> None:
        """:meth:`rejoin` the fleet at its peers' round, decided once, as soon as
        :data:`~airgossip.edge.agent.rejoin.MIN_QUORUM` distinct peers have named their rounds
        (acknowledgements, messages), waiting at most ``wait_s`` for them.

        The round is one a quorum of the peers heard agree on
        (:func:`~airgossip.edge.agent.rejoin.fleet_round`): one peer cannot make the agent skip. An
        agent whose phase has fewer peers than a quorum never skips on its peers' word (its
        coordinator's, :meth:`rejoin`, is another matter).
        """
        agent = self.agent
        if agent.peers_in_reach() < MIN_QUORUM:
            self._rejoining = False  # no quorum can ever be heard: go on
            return
        self._wait(lambda: len(agent.peer_rounds()) >= MIN_QUORUM, wait_s)
        heard = fleet_round(agent.peer_rounds())
        if heard is None:
            if wait_s > 0:
                self._rejoining = False  # too few peers answer: go on without skipping
            return  # too few heard yet: decide after the next round's exchanges
        self._rejoining = False
        self.rejoin(heard)
