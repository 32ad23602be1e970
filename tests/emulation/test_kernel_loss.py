"""One meaning of ``--loss`` in kernel modes: the same fleet of the same seed sends the same
number of messages in namespaces as in process mode, and the summary and results.json show
message losses and the kernel's packet drops apart (from the kernel's own counters).

Needs root, iproute2 and iptables; skips with the reason otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airgossip.emulation.networks.kernel import kernel_support
from tests.support.cli import airgossip, assert_tcp_carried_every_message

SUPPORT = kernel_support()
pytestmark = pytest.mark.skipif(not SUPPORT.available, reason=SUPPORT.reason or "no kernel support")
FLEET = ("--agents", "4", "--rounds", "15", "--seed", "0", "--loss", "0.1")


def run(mode: str, out: Path) -> tuple[dict[str, object], str]:
    result = airgossip("run", "--mode", mode, *FLEET, "--out", str(out), timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((out / "results.json").read_text()), result.stdout


def kernel_counters(out: Path) -> tuple[int, int]:
    """Packets seen and dropped, summed over ``kernel.json``'s links."""
    links = json.loads((out / "kernel.json").read_text())["links"]
    return sum(k["packets_seen"] for k in links), sum(k["packets_dropped"] for k in links)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_namespaces_send_what_processes_send_and_show_packet_drops_apart(
    tmp_path: Path,
) -> None:
    process, _ = run("process", tmp_path / "process")
    kernel, summary = run("namespaces", tmp_path / "namespaces")
    sent = process["final"]["messages_sent"], kernel["final"]["messages_sent"]  # type: ignore[index]
    assert sent[0] == 4 * 15 * 2  # every agent, every round, both out-neighbours
    assert abs(sent[1] - sent[0]) <= 0.05 * sent[0], sent
    # Messages: TCP carried every one through the drops. Packets: the kernel dropped them.
    assert_tcp_carried_every_message(tmp_path / "namespaces", kernel)
    seen, dropped = kernel_counters(tmp_path / "namespaces")
    assert kernel["kernel"] == {
        "packets_seen": seen, "packets_dropped": dropped,
        "drop_rate": pytest.approx(dropped / seen, abs=1e-6), "links": 12,
    }  # fmt: skip
    assert dropped / seen == pytest.approx(0.1, rel=0.3)
    row = " ".join(line.strip() for line in summary.splitlines() if line.strip())
    assert f"the kernel dropped {dropped:,} of {seen:,} packets" in row, summary
    assert "kernel" not in process  # process mode's links are not the kernel's
    print(f"\nmessages: process {sent[0]}, namespaces {sent[1]}; kernel dropped {dropped} of "
          f"{seen} packets")  # fmt: skip
