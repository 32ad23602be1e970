"""Waits that say what they wait for: a line every few seconds, with since when."""

from __future__ import annotations

import logging

import pytest

from airgossip.edge.agent.waiting import WaitReporter
from tests.support.agents import FakeClock


def test_a_line_every_few_seconds_with_since_when(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    waiting = WaitReporter("agent-3", "the fleet to fill", every_s=5.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="airgossip.agent"):
        assert not waiting.tick("1 of 4")  # not yet: the first line comes after 5 s
        clock.now += 5.0
        assert waiting.due() and waiting.tick("2 of 4")
        clock.now += 1.0
        assert not waiting.tick("3 of 4")
        clock.now += 4.0
        assert waiting.tick("3 of 4")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("agent-3 waiting for the fleet to fill since ")
    assert lines[0].endswith("(5 s): 2 of 4") and lines[1].endswith("(10 s): 3 of 4")
