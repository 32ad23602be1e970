"""Seeded ``inproc`` and ``virtual`` runs give the results they gave when recorded.

The files under ``recorded/`` hold a run's settings and its ``results.json`` as written
before the fleet and network contracts were introduced; any change to the code that moves a
number of a seeded run shows up here. They were re-recorded once since, when the gossip
header gained the receiver, fleet and epoch: every message grew by those bytes, which moved
``bytes_sent`` and, in the virtual mode, the airtime messages take (with the new fields'
bytes left out of the count, the old files still matched exactly). Timing fields are left
out: the wall-clock time of a run and when it was launched (in the virtual mode,
``train_wall_s``, schema 1's ``wall_s``, is virtual time and is compared); so are the
``schema_version`` and the ``[containers]``, ``[ray]``, ``[privacy]``, ``[transport]``,
``[[device_classes]]``, ``pace`` and ``mixing_steps`` settings, added since (at their
defaults: none of these runs asks for privacy, the bulk path or uneven devices, and their
static graphs take one gossip step a round). Counts and strings compare exactly.
Floats of float64 runs (consensus) compare to 1e-9 relative, which allows the last bits of a
BLAS kernel chosen for another CPU and nothing else; float32 training (digits) goes through
kernels that differ with the CPU's vector units and the thread count (measured: up to 2.1e-7
relative between runs with 1 and 2 threads or AVX2 and AVX-512 kernels, and 5e-3 relative on
a distance of 5e-8 with ATEN_CPU_CAPABILITY=default), so its figures compare to 1e-5
relative or 1e-6 absolute: far below any change of the code that moves a run, which moves
them by 1e-3 and more.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from airgossip.emulation.fleets import run_fleet
from airgossip.scenario.config import load_config, read_scenario
from airgossip.scenario.wireless import scenario_path

RECORDED = Path(__file__).parent / "recorded"
TIMING = ("total_wall_s", "versions")
#: results.json's layout version, written since schema 2 (the recordings are schema 1).
SCHEMA = "schema_version"


def comparable(results: dict[str, Any], real_time: bool) -> dict[str, Any]:
    results = {k: v for k, v in results.items() if k not in (*TIMING, SCHEMA)}
    # Added after the recordings, used by none of their runs: how containers and Ray run
    # agents, privacy, the bulk path.
    results["config"].pop("containers", None)
    results["config"].pop("ray", None)
    assert results["config"].pop("privacy", {}).get("mechanism", "none") == "none"
    assert results["config"].pop("transport", {}).get("bulk_bytes") is None
    # ... uneven devices and the pace, at their defaults (every agent of the host's class).
    assert results["config"].pop("device_classes", []) == []
    assert results["config"].pop("pace", "rounds") == "rounds"
    # ... and the gossip steps a round, automatic (one step on these runs' static graphs).
    assert results["config"].pop("mixing_steps", "auto") == "auto"
    if results["config"].get("wireless"):
        results["config"]["wireless"].pop("epoch_unix", None)
        # Added after the recordings (issue 37); the presets' heights, at 1.5 m and 1 m, moved
        # no number of the wifi-indoor run (equal heights: 3D distance = 2D distance).
        results["config"]["wireless"].pop("antenna_height_m", None)
    if real_time:
        for row in [*results["rounds"], results["final"]]:
            row.pop("train_wall_s")
    return results


def as_schema_2(recorded: dict[str, Any]) -> dict[str, Any]:
    """A recording (schema 1, files left as written) with each round's time under schema 2's
    name, ``train_wall_s`` (schema 1's ``wall_s``)."""
    recorded = json.loads(json.dumps(recorded))
    for row in [*recorded["rounds"], recorded["final"]]:
        if "wall_s" in row:  # recorded for the virtual mode only (virtual time)
            row["train_wall_s"] = row.pop("wall_s")
    return recorded


#: (relative, absolute) tolerance of floats: float64 runs, float32 training.
FLOAT64 = (1e-9, 1e-15)
FLOAT32 = (1e-5, 1e-6)


def tolerance(recorded: dict[str, Any]) -> tuple[float, float]:
    """Consensus gossips float64 and trains nothing; every other recorded task trains in
    float32."""
    return FLOAT64 if recorded["results"]["config"]["task"]["name"] == "consensus" else FLOAT32


def differences(
    expected: Any, actual: Any, where: str = "", tol: tuple[float, float] = FLOAT64
) -> list[str]:
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = [f"{where}.{k}: missing" for k in expected if k not in actual]
        out += [f"{where}.{k}: not recorded" for k in actual if k not in expected]
        for key in sorted(expected.keys() & actual.keys()):
            out += differences(expected[key], actual[key], f"{where}.{key}", tol)
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{where}: {len(actual)} items, recorded {len(expected)}"]
        return [d for i, (e, a) in enumerate(zip(expected, actual, strict=True))
                for d in differences(e, a, f"{where}[{i}]", tol)]  # fmt: skip
    if isinstance(expected, float) and isinstance(actual, float | int):
        if math.isclose(expected, actual, rel_tol=tol[0], abs_tol=tol[1]):
            return []
    elif expected == actual and type(expected) is type(actual):
        return []
    return [f"{where}: {actual!r}, recorded {expected!r}"]


@pytest.mark.parametrize("name", sorted(p.stem for p in RECORDED.glob("*.json")))
def test_seeded_run_gives_its_recorded_results(name: str, tmp_path: Path) -> None:
    recorded = json.loads((RECORDED / f"{name}.json").read_text())
    preset = recorded["preset"]
    base = read_scenario(scenario_path(preset)) if preset else None
    config = load_config(None, recorded["settings"], base=base)
    results = run_fleet(config, tmp_path).to_json()
    real_time = config.mode == "inproc"
    found = differences(
        as_schema_2(recorded["results"]), comparable(results, real_time), tol=tolerance(recorded)
    )
    assert not found, "\n".join(found[:20])


def test_the_comparison_sees_a_changed_number() -> None:
    recorded = json.loads((RECORDED / "inproc-digits.json").read_text())["results"]
    changed = json.loads(json.dumps(recorded))
    changed["final"]["messages_dropped"] += 1
    changed["rounds"][2]["mean_accuracy"] *= 1 + 1e-4
    found = differences(recorded, changed, tol=FLOAT32)
    assert len(found) == 2 and any("messages_dropped" in f for f in found)
