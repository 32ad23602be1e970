"""How many gossip steps an agent takes per local step (``mixing_steps``), and the rule that
picks it by default.

A round is one local step followed by ``k`` gossip steps: push, wait for in-neighbours, mix,
``k`` times. One step is what gossip always did; more steps bring the models closer together
before the next local step, at ``k`` times the messages. Push-sum stays exact under loss at
any ``k``: its messages carry running sums, so a step's message that is lost goes with the
next one, whichever step or round that is.

**The rule (``mixing_steps = "auto"``, the default).** A fleet's agents must agree on ``k``
(step ``j`` of round ``r`` uses phase ``(r - 1) k + j + 1`` of a periodic graph, and an agent
waits for its in-neighbours' step ``j``), so the rule uses only what every agent holds
alike: the graph's period and the mixing it reaches over one period (``|lambda2|``, computed
by whoever assigns the graph), and the size of a message (the model's).

1. ``k = 1`` for an algorithm that mixes once per local step by its nature
   (:attr:`~airgossip.edge.algorithms.base.GossipAlgorithm.several_mixes` is false); for a
   task without local training (``consensus``: a round is one gossip step already, and more
   steps a round would only rename rounds); for a message above :data:`AUTO_MESSAGE_BYTES`
   (each further exchange then costs about as much time as a small model's local step on
   a slow link); where ``|lambda2|`` is not known; and on a static graph (period 1): each
   further step would send the whole graph's messages again.
2. On a periodic graph, whole periods: the fewest whose mixing contracts the disagreement to
   :data:`TARGET_CONTRACTION` or less, ``k = period * ceil(log(target) / log(|lambda2|))``
   (one period where ``|lambda2|`` is at or under the target), as long as that is at most
   :data:`~airgossip.edge.settings.MAX_MIXING_STEPS` steps; more, and ``k = 1``.

A periodic graph's phases are parts of one graph, meant to be cycled through: a period a
round mixes over the whole graph at the messages one round on the whole graph would send.
So a one-peer exponential graph (one out-neighbour a step, hops ``1, 2, 4, ...``) takes its
``ceil(log2 n)`` steps a round: the exact average on a power of two agents, at the bytes of
one round on the exponential graph, which keeps one step (as every static graph does).
Where a driver measures real costs (agent processes), the agents then come down to one
step if further steps cost more than they save (:class:`StepCount`), and agree on the
fewest any of them asks for. ``docs/algorithms.md`` ("Mixing steps per round") has the rule
for users, ``docs/performance.md`` what it gains.
"""

from __future__ import annotations

import math
from typing import Literal

from airgossip.edge.settings import MAX_MIXING_STEPS

#: Disagreement contraction per round the automatic rule aims for (``|lambda2|^periods``).
TARGET_CONTRACTION = 0.5
#: The largest message (bytes, uncompressed) for which the automatic rule takes more than one
#: step: 256 KiB crosses a 20 Mbit/s link in about 0.1 s, the time of a small model's local
#: step; larger models' local steps take longer, and so do their messages.
AUTO_MESSAGE_BYTES = 256 * 1024
#: A further step of a round waits for its in-neighbours' same step at most this many times
#: the typical such wait...
STEP_WAIT_FACTOR = 4.0
#: ...and at least this long (seconds), within the round's ``wait_timeout_s`` either way.
STEP_WAIT_FLOOR_S = 0.05

#: Rounds whose costs an agent measures before it says how many steps it wants, after its
#: first (connections are set up then, caches are cold).
MEASURED_ROUNDS = 2
#: Further steps pay while they take at most this share of a one-step round (its local step
#: and one gossip step): the rounds they save are about that many (on the digits fleet,
#: 8 rounds to 0.90 against 10, see docs/performance.md).
STEP_BUDGET = 0.25

MixingSetting = int | Literal["auto"]


def auto_mixing_steps(lambda2: float, period: int, message_bytes: int) -> int:
    """The automatic rule's steps per round (see the module docstring) for a graph whose
    mixing over one ``period`` of phases has second-largest modulus ``lambda2``, with
    messages of ``message_bytes``."""
    if message_bytes > AUTO_MESSAGE_BYTES or period <= 1 or not 0.0 <= lambda2 < 1.0:
        return 1
    # (A tolerance keeps a float's last bits from adding a period: 0.7071^2 is 0.5.)
    periods = (
        1
        if lambda2 <= TARGET_CONTRACTION
        else math.ceil(math.log(TARGET_CONTRACTION) / math.log(lambda2) - 1e-6)
    )
    steps = periods * period
    return steps if steps <= MAX_MIXING_STEPS else 1


def mixing_steps(
    setting: MixingSetting,
    *,
    several_mixes: bool,
    lambda2: float,
    period: int,
    message_bytes: int,
) -> int:
    """The steps per round an agent takes: ``setting`` where it is a number, else the
    automatic rule's (always 1 for an algorithm that cannot mix several times)."""
    if setting != "auto":
        return int(setting)
    if not several_mixes:
        return 1
    return auto_mixing_steps(lambda2, period, message_bytes)


def worth_steps(steps: int, one_step_s: float, further_s: float) -> int:
    """The steps a round an agent asks for once it measured them: ``steps`` while the
    ``steps - 1`` further gossip steps (``further_s`` each) take at most :data:`STEP_BUDGET`
    of a one-step round (its local step and first gossip step, ``one_step_s``), else one."""
    return steps if (steps - 1) * further_s <= STEP_BUDGET * one_step_s else 1


class StepCount:
    """The gossip steps a round an agent takes, decided where the whole fleet agrees.

    A number in the settings is taken as it is. At ``auto`` the agent starts from the rule's
    count (:func:`mixing_steps`, the same on every agent) and may come down from it, never go
    up: where a driver measures real costs (agent processes), after
    :data:`MEASURED_ROUNDS` rounds it asks for :func:`worth_steps` of what its local step and
    its gossip steps took; and it takes the fewest steps any in-neighbour's message says it
    takes. Every message says its sender's count where the rule takes more than one step,
    so the fewest that any agent asks for reaches the whole fleet within a few rounds of its
    graph's diameter, and the fleet agrees again (for the rest of the run: a count heard
    stays, whatever graph comes next). :meth:`now` is latched by the agent at the start of
    each round.
    """

    def __init__(self, setting: MixingSetting) -> None:
        self.setting = setting
        #: The rule's count for the current assignment (:func:`mixing_steps`).
        self.rule = 1
        #: What this agent asked for after measuring; None: not yet (or not measured).
        self.asked: int | None = None
        #: The fewest steps an in-neighbour's message said; None: none said yet.
        self.heard: int | None = None
        self._costs: list[tuple[float, float]] = []

    def now(self) -> int:
        """The steps a round to take now."""
        if self.setting != "auto":
            return self.rule
        return min(self.rule, self.asked or self.rule, self.heard or self.rule)

    def hear(self, steps: int) -> None:
        """An in-neighbour's message says it takes ``steps`` a round (0: it does not say)."""
        if self.setting == "auto" and steps > 0:
            self.heard = steps if self.heard is None else min(self.heard, steps)

    def measured(self, local_s: float, steps_s: list[float]) -> str:
        """A round took ``local_s`` for its local step and ``steps_s`` for each of its gossip
        steps; what to log when the agent decides (empty: nothing yet)."""
        if self.setting != "auto" or self.asked is not None or len(steps_s) < 2:
            return ""
        self._costs.append((local_s + steps_s[0], sum(steps_s[1:]) / (len(steps_s) - 1)))
        if len(self._costs) < 1 + MEASURED_ROUNDS:
            return ""
        counted = self._costs[1:]
        one_step = sum(c[0] for c in counted) / len(counted)
        further = sum(c[1] for c in counted) / len(counted)
        steps = len(steps_s)
        self.asked = worth_steps(steps, one_step, further)
        keeps = "keeps" if self.asked == steps else "asks for one instead of"
        return (
            f"{keeps} {steps} gossip steps a round: a one-step round took "
            f"{one_step * 1e3:.1f} ms, a further step {further * 1e3:.1f} ms "
            f"(they may take {STEP_BUDGET:g} of it)"
        )


def step_position(round_index: int, step: int, steps: int) -> int:
    """Which gossip step of the run step ``step`` of round ``round_index`` is, counting from 1
    (round ``r`` is position ``r`` at one step per round): it picks a periodic graph's phase
    and orders in-neighbours' messages."""
    return (round_index - 1) * steps + step + 1


class StepWaits:
    """How long a round's further gossip steps wait for their in-neighbours' same step.

    A step's mix is worth most when it holds its in-neighbours' same step (on a one-peer
    exponential graph, a round's steps then average exactly). In a further step of a round
    the in-neighbours that keep up are at most an exchange away, and a message that has not
    come in a few times the typical wait was lost on the way: waiting the whole
    ``wait_timeout_s`` for it would cost several timeouts a round on a lossy link. So a
    further step waits :data:`STEP_WAIT_FACTOR` times the typical wait (an exponential
    average of the waits that ended with the step heard), at least
    :data:`STEP_WAIT_FLOOR_S`, never longer than the round's timeout. A message not waited
    for is not lost: push-sum folds its mass in at a later step.
    """

    def __init__(self) -> None:
        #: The typical wait (seconds) that ended with the step heard; None: none yet.
        self.typical_s: float | None = None

    def timeout(self, longest_s: float) -> float:
        """The longest wait for a further step's in-neighbours, given the round's
        ``longest_s``."""
        if self.typical_s is None:
            return longest_s
        return min(longest_s, max(STEP_WAIT_FLOOR_S, STEP_WAIT_FACTOR * self.typical_s))

    def waited(self, seconds: float, *, heard: bool) -> None:
        """A further step waited ``seconds``: until its in-neighbours' same step was heard
        (``heard``), or to its timeout (which says nothing of the typical wait)."""
        if heard:
            typical = self.typical_s
            self.typical_s = seconds if typical is None else 0.8 * typical + 0.2 * seconds
