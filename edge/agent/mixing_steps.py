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
``docs/algorithms.md`` ("Mixing steps per round") has the rule for users,
``docs/performance.md`` what it gains.
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
