"""Agent ids, seeds and counter-based hashes: each written once, stable across machines."""

from __future__ import annotations

import numpy as np

from airgossip.common.identity import agent_id, agent_ids, natural_order
from airgossip.common.seeds import (
    derive_seed,
    hash64,
    keyed_hash,
    keyed_uniform,
    splitmix64,
    splitmix64_array,
)
from airgossip.edge.observability.stats import Counters, RoundRecord


def test_agent_ids_and_their_order() -> None:
    assert agent_ids(3) == ["agent-0", "agent-1", "agent-2"] and agent_id(12) == "agent-12"
    assert natural_order(["agent-10", "agent-2", "agent-1"]) == ("agent-1", "agent-2", "agent-10")


def test_seeds_are_stable_values() -> None:
    # Fixed values: a change here changes every seeded run (drops, codecs, initialisation).
    assert hash64("agent-0", "agent-1") == 0x4C3B261F267E3808
    assert derive_seed(7, "agent-3") == hash64(7, "agent-3") >> 1 < 2**63
    assert derive_seed(1, 2) != derive_seed(2, 1)


def test_splitmix64_one_value_and_an_array_agree() -> None:
    keys = [0, 1, 2**63, 2**64 - 1, 0x9E3779B97F4A7C15, 12345678901234567]
    array = splitmix64_array(np.array(keys, dtype=np.uint64))
    assert [int(v) for v in array] == [splitmix64(k) for k in keys]
    assert splitmix64(0) == 0xE220A8397B1DCDAF  # SplitMix64's first output from state 0
    assert keyed_hash(1, 2) == splitmix64(splitmix64(1) ^ 2)
    assert 0.0 <= keyed_uniform(3, 4) < 1.0


def test_counters_travel_flat_and_come_back() -> None:
    record = RoundRecord("agent-1", 3, 0.5, counters=Counters(bytes_sent=10, messages_failed=2))
    data = record.to_json()
    assert data["bytes_sent"] == 10 and "counters" not in data
    back = RoundRecord.from_json({**data, "estimate_index": 0})
    assert back.counters == record.counters and back.counters.messages_lost == 2
    assert (
        Counters.names()[0] == "bytes_sent" and Counters.from_fields(back.counters) == back.counters
    )
