"""Several gossip steps per local step: the automatic rule, the setting's checks, the wire's
step, the waits counted in steps, and the count a fleet agrees on."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from pydantic import ValidationError

from airgossip.common.topology import assignments_for_graph, build_graph
from airgossip.edge.agent.admission import Admission
from airgossip.edge.agent.mixing_steps import (
    AUTO_MESSAGE_BYTES,
    MEASURED_ROUNDS,
    STEP_BUDGET,
    STEP_WAIT_FACTOR,
    STEP_WAIT_FLOOR_S,
    StepCount,
    StepWaits,
    auto_mixing_steps,
    mixing_steps,
    step_position,
    worth_steps,
)
from airgossip.edge.agent.pacing import step_heard, wait_over
from airgossip.edge.algorithms.registry import algorithm_class
from airgossip.edge.settings import MAX_MIXING_STEPS, AgentSettings
from airgossip.edge.transport.base import MessageHeader, Rejected
from airgossip.edge.transport.wire import header_from_proto, header_to_proto


def _lambda2_and_period(topology: str, n: int = 8) -> tuple[float, int]:
    graph = build_graph(topology, n)
    first = next(iter(assignments_for_graph(graph, {f"a{i}": "" for i in range(n)}).values()))
    return first.lambda2, len(first.schedule)


@pytest.mark.parametrize(
    ("topology", "n", "steps"),
    [
        ("one-peer-exponential", 8, 3),  # a whole period: the exact average on 8 agents
        ("one-peer-exponential", 6, 3),  # |lambda2| 0.22 over the period of 3
        ("one-peer-exponential", 100, 7),
        ("one-peer-exponential", 2, 1),  # one phase: a static graph
        # Static graphs keep one step: a further one sends the whole graph's messages again.
        ("exponential", 8, 1),
        ("exponential", 16, 1),  # |lambda2| 0.6
        ("ring", 8, 1),  # |lambda2| 0.805
        ("complete", 8, 1),
    ],
)
def test_the_rule_takes_whole_periods_of_a_periodic_graph(
    topology: str, n: int, steps: int
) -> None:
    lambda2, period = _lambda2_and_period(topology, n)
    assert auto_mixing_steps(lambda2, period, message_bytes=20_000) == steps


def test_the_rule_keeps_one_step_where_more_would_not_pay() -> None:
    lambda2, period = _lambda2_and_period("one-peer-exponential")
    # A large message: each further exchange would cost about a local step.
    assert auto_mixing_steps(lambda2, period, AUTO_MESSAGE_BYTES + 1) == 1
    assert auto_mixing_steps(lambda2, period, AUTO_MESSAGE_BYTES) == 3
    # Mixing unknown, or no mixing at all (a disconnected graph).
    assert auto_mixing_steps(math.nan, 3, 1000) == 1
    assert auto_mixing_steps(1.0, 3, 1000) == 1
    # Periods until the target: 0.6 needs 2 (0.36), 0.8 needs 4 (0.41).
    assert auto_mixing_steps(0.6, 2, 1000) == 4
    assert auto_mixing_steps(0.8, 4, 1000) == 16
    # More steps than a setting may ask for: one step.
    assert auto_mixing_steps(0.8, 5, 1000) == 1
    assert MAX_MIXING_STEPS < 4 * 5
    # The last bits of a float do not add a period: 0.5 ** 0.5 squared is the target.
    assert auto_mixing_steps(0.5**0.5 * (1 + 1e-12), 2, 1000) == 4


def test_a_number_is_taken_as_it_is_and_auto_only_where_the_algorithm_can() -> None:
    shared = {"lambda2": 1e-17, "period": 3, "message_bytes": 1000}
    assert mixing_steps(5, several_mixes=True, **shared) == 5
    assert mixing_steps(5, several_mixes=True, lambda2=0.9, period=1, message_bytes=10**9) == 5
    assert mixing_steps("auto", several_mixes=True, **shared) == 3
    assert mixing_steps("auto", several_mixes=False, **shared) == 1
    assert algorithm_class("push-sum").several_mixes
    for name in ("local-sgd", "gradient-tracking", "robust-push-sum", "dpsgd", "choco"):
        assert not algorithm_class(name).several_mixes, name


def test_the_setting_says_what_is_allowed() -> None:
    assert AgentSettings().mixing_steps == "auto"
    assert AgentSettings(mixing_steps=3).mixing_steps == 3
    for bad in (0, MAX_MIXING_STEPS + 1):
        with pytest.raises(ValidationError, match=r"mixing_steps is \"auto\" or a number"):
            AgentSettings(mixing_steps=bad)
    with pytest.raises(ValidationError, match="mixes once per local step"):
        AgentSettings(algorithm="local-sgd", mixing_steps=2)
    assert AgentSettings(algorithm="local-sgd", mixing_steps=1).mixing_steps == 1
    with pytest.raises(ValidationError):
        AgentSettings.model_validate({"mixing_steps": "many"})


def test_positions_order_the_steps_of_every_round() -> None:
    assert [step_position(r, 0, 1) for r in (1, 2, 3)] == [1, 2, 3]  # one step: the round
    order = [step_position(r, s, 3) for r in (1, 2) for s in range(3)]
    assert order == [1, 2, 3, 4, 5, 6]


def test_steps_are_waited_for_as_rounds_are_counted_in_steps() -> None:
    # 3 steps a round, staleness 1: step 1 of round 9 (position 26) needs in-neighbours at
    # position 23 or later (step 1 of round 8); patience is 4 rounds' worth of steps.
    need, patience = step_position(9, 1, 3) - 3, 4 * 3
    assert need == 23
    assert not wait_over([20], need, patience)  # behind, within reach: waited for
    assert wait_over([23], need, patience)
    assert wait_over([30, 5], need, patience)  # one far behind is not waited for...
    assert not wait_over([5], need, patience)  # ...unless all are: the timeout paces it


def test_a_further_step_waits_for_the_same_step_of_in_neighbours_that_keep_up() -> None:
    # 3 steps a round: round 3 is positions 7, 8, 9. At its step 1 (position 8), an
    # in-neighbour last heard at step 1 of round 2 (position 5: on a one-peer graph it sends
    # to this agent once a round) or later keeps up: its step is on its way.
    assert not step_heard([8, 5], need=8, steps=3)
    assert not step_heard([7], need=8, steps=3)
    assert step_heard([8, 12], need=8, steps=3)
    # One heard last more than a round's worth of steps ago is left to the staleness wait.
    assert step_heard([4, 1, 0], need=8, steps=3)
    assert step_heard([], need=8, steps=3)


def test_the_same_step_is_waited_for_a_few_typical_waits_never_past_the_timeout() -> None:
    waits = StepWaits()
    assert waits.timeout(0.25) == 0.25  # nothing known yet: the round's timeout
    waits.waited(0.02, heard=True)
    assert waits.timeout(0.25) == pytest.approx(STEP_WAIT_FACTOR * 0.02)
    waits.waited(5.0, heard=False)  # a timeout says nothing of the typical wait
    assert waits.timeout(0.25) == pytest.approx(STEP_WAIT_FACTOR * 0.02)
    waits.waited(0.12, heard=True)
    assert waits.typical_s == pytest.approx(0.8 * 0.02 + 0.2 * 0.12)
    assert waits.timeout(0.1) == 0.1  # never past the round's
    fast = StepWaits()
    fast.waited(0.0, heard=True)
    assert fast.timeout(0.25) == STEP_WAIT_FLOOR_S


def test_more_steps_are_kept_while_they_cost_a_quarter_of_a_one_step_round() -> None:
    assert worth_steps(3, one_step_s=0.4, further_s=0.05) == 3  # 0.1 s of 0.4
    assert worth_steps(3, one_step_s=0.4, further_s=0.051) == 1
    assert worth_steps(3, one_step_s=0.015, further_s=0.03) == 1  # cheap local steps
    assert STEP_BUDGET == 0.25


def test_a_count_comes_down_on_what_it_measured_or_heard_never_up() -> None:
    count = StepCount("auto")
    count.rule = 3
    assert count.now() == 3
    # The first round is left out; then MEASURED_ROUNDS rounds decide.
    assert count.measured(0.01, [0.005, 0.3, 0.3]) == ""  # a slow first round
    for _ in range(MEASURED_ROUNDS - 1):
        assert count.measured(0.39, [0.01, 0.05, 0.05]) == ""
    said = count.measured(0.39, [0.01, 0.05, 0.05])
    assert said.startswith("keeps 3 gossip steps") and count.asked == 3
    assert count.now() == 3
    count.hear(0)  # a sender that does not say
    count.hear(5)  # more than the rule: the fleet never goes up
    assert count.now() == 3
    count.hear(1)
    count.hear(3)  # the fewest heard stays
    assert count.now() == 1 and count.heard == 1
    # A cheap local step: one step is asked for.
    cheap = StepCount("auto")
    cheap.rule = 3
    for _ in range(1 + MEASURED_ROUNDS):
        said = cheap.measured(0.01, [0.005, 0.03, 0.03])
    assert said.startswith("asks for one instead of 3") and cheap.now() == 1
    # A number in the settings is taken as it is: nothing measured, nothing heard.
    fixed = StepCount(3)
    fixed.rule = 3
    fixed.hear(1)
    assert fixed.measured(0.01, [0.005, 0.03, 0.03]) == "" and fixed.now() == 3


def _header(step: int) -> MessageHeader:
    return MessageHeader(
        sender="a1", round=4, seq=5, base_seq=4, algorithm="push-sum", codec="float64",
        numel=3, payload_bytes=24, scalars={"y": 1.0}, receiver="a0", step=step,
    )  # fmt: skip


def test_the_step_crosses_the_wire_and_a_step_out_of_range_is_refused() -> None:
    assert header_from_proto(header_to_proto(_header(2))).step == 2
    assert header_from_proto(header_to_proto(_header(0))).step == 0
    assert header_from_proto(header_to_proto(replace(_header(1), steps=3))).steps == 3
    algorithm = algorithm_class("push-sum")(torch.zeros(3), dtype=torch.float64)
    refused: list[Rejected] = []
    admission = Admission.of("a0", algorithm, fleet="", digest="", refuse=refused.append)
    admission.set_in_neighbours({"a1"}, 0)
    admission.check_header(_header(MAX_MIXING_STEPS - 1), 4, 1)
    with pytest.raises(Rejected, match=f"gossip step {MAX_MIXING_STEPS} of 0 a round"):
        admission.check_header(_header(MAX_MIXING_STEPS), 4, 1)
    with pytest.raises(Rejected, match=f"of {MAX_MIXING_STEPS + 1} a round is beyond"):
        admission.check_header(replace(_header(0), steps=MAX_MIXING_STEPS + 1), 4, 1)
