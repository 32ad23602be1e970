"""In-process receivers take the sender's decoded vector instead of decoding the bytes: the
same numbers either way, bytes still counted from the encoded form."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import airgossip.edge.agent.admission as admission
from airgossip.edge.transport import GossipMessage
from airgossip.emulation.fleets.inproc import run_in_process
from airgossip.scenario.config import load_config


def _run(monkeypatch: pytest.MonkeyPatch, handover: bool, **settings: Any) -> list[Any]:
    seen = {"handed": 0}
    original = admission._handed_over

    def counted(message: GossipMessage, dtype: torch.dtype) -> torch.Tensor | None:
        vector = original(message, dtype) if handover else None
        seen["handed"] += vector is not None
        return vector

    monkeypatch.setattr(admission, "_handed_over", counted)
    config = load_config(None, {
        "mode": "inproc", "agents": 6, "rounds": 5, "topology": "exponential",
        "network": {"loss": 0.2}, **settings,
    })  # fmt: skip
    records = run_in_process(config, batched=False)  # the per-agent message path
    assert (seen["handed"] > 0) == handover
    return [
        (r.agent_id, r.round, r.counters, r.metrics, None if r.estimate is None
         else r.estimate.tolist())
        for agent in sorted(records) for r in records[agent]
    ]  # fmt: skip


@pytest.mark.parametrize(
    "settings",
    [
        {"task": {"name": "consensus"}},
        {"task": {"name": "consensus"}, "algorithm": "quantized-push-sum",
         "compression": "qsgd:4"},
        {"task": {"name": "consensus"}, "algorithm": "push-sum", "compression": "randomk:0.5"},
        {"task": {"name": "digits", "local_steps": 1}, "algorithm": "choco",
         "compression": "topk:0.05", "topology": "ring"},
        {"task": {"name": "digits", "local_steps": 1}, "algorithm": "dpsgd",
         "compression": "bf16", "topology": "ring"},
    ],
)  # fmt: skip
def test_handing_the_decoded_vector_over_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any]
) -> None:
    decoded = _run(monkeypatch, True, **settings)
    monkeypatch.undo()
    assert decoded == _run(monkeypatch, False, **settings)  # counters include the bytes sent


def test_a_handed_over_vector_is_a_copy_and_must_match_the_header() -> None:
    from airgossip.edge.transport import MessageHeader

    vector = torch.arange(4, dtype=torch.float64)
    header = MessageHeader("a", 1, 1, 0, "push-sum", "float64", 4, 32)
    copy = admission._handed_over(GossipMessage(header, b"", vector), torch.float64)
    assert copy is not None and copy.data_ptr() != vector.data_ptr()
    assert torch.equal(copy, vector)
    assert admission._handed_over(GossipMessage(header, b"", vector), torch.float32) is None
    short = MessageHeader("a", 1, 1, 0, "push-sum", "float64", 3, 24)
    assert admission._handed_over(GossipMessage(short, b"", vector), torch.float64) is None
