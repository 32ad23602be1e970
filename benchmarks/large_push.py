"""Large push: a 2.5 GB float32 model pushed between two processes over the bulk path.

The receiver is a ``GrpcTransport`` with the bulk path in a process of its own, whose
handler checks the payload (CRC-32 against the sender's) and reports its memory: the peak
resident set (``VmHWM``) against the resident set before the push. The target (issue 23):
the receiver's peak RSS growth at most 1.3x the model's size. Over mutual TLS, as fleets
run by default.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from benchmarks.suite import Context, Outcome
from benchmarks.transport import RECEIVER, SENDER, _certificates, _receiver, _stopped

NUMEL = 625_000_000  # 2.5 GB of float32


def _status(field: str) -> int:
    """A ``kB`` field of this process's ``/proc/self/status``, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return 1024 * int(line.split()[1])
    return 0


def run(ctx: Context) -> list[Outcome]:
    from edge.security.tls import TlsCredentials
    from edge.transport.base import GossipMessage, MessageHeader, SendOutcome
    from edge.transport.grpc_transport import GrpcTransport

    folder = _certificates(ctx)
    report = ctx.work / "large-push.json"
    process, address = _receiver(
        "large", ctx, NUMEL, [str(folder), str(report)], "benchmarks.large_push"
    )
    payload = np.random.default_rng(0).random(NUMEL, dtype=np.float32)
    data = memoryview(payload).cast("B")
    crc = zlib.crc32(data)
    security = TlsCredentials.load(folder, SENDER)
    transport = GrpcTransport(SENDER, security=security, send_timeout_s=900.0, bulk_bytes=1 << 20)
    header = MessageHeader(
        sender=SENDER, round=1, seq=1, base_seq=0, algorithm="push-sum", codec="raw:float32",
        numel=NUMEL, payload_bytes=4 * NUMEL,
    )  # fmt: skip
    outcome: list[SendOutcome] = []
    done = threading.Event()
    with _stopped(process):
        began = time.perf_counter()
        message = GossipMessage(header, data)
        transport.send(RECEIVER, address, message, lambda o: (outcome.append(o), done.set()))
        done.wait()
        seconds = time.perf_counter() - began
        transport.close()
    if not outcome[0].delivered:
        raise RuntimeError(f"push failed: {outcome[0].error}")
    got = json.loads(report.read_text())
    growth = (got["peak_rss"] - got["rss_before"]) / (4 * NUMEL)
    exact = got["crc"] == crc
    figures = {"bytes": 4 * NUMEL, "seconds": round(seconds, 2), "crc_equal": exact,
               "rss_growth_ratio": round(growth, 3), **got}  # fmt: skip
    measured = (
        f"2.5 GB over mutual TLS in {seconds:.1f} s ({4 * NUMEL / seconds / 1e6:.0f} MB/s); "
        f"receiver's peak RSS growth {growth:.2f}x the model; payload CRC-32 "
        + ("equal" if exact else "DIFFERENT")
    )
    return [
        Outcome(
            "large push",
            "2.5 GB float32 pushed between two agents: receiver's peak RSS growth <= 1.3x",
            measured,
            growth <= 1.3 and exact,
            figures,
        )
    ]


def serve(ready: Path, numel: str, credentials: str, report: str) -> None:
    from edge.algorithms.base import Ack
    from edge.security.tls import TlsCredentials
    from edge.transport.base import GossipMessage, MessageHeader, Rejected
    from edge.transport.grpc_transport import GrpcTransport

    class Checker:
        def accepts(self, sender: str) -> None:
            pass

        def admit(self, header: MessageHeader) -> None:
            pass

        def deliver(self, message: GossipMessage) -> Ack:
            peak = _status("VmHWM")
            result = {"rss_before": before, "peak_rss": peak, "crc": zlib.crc32(message.data)}
            Path(report).write_text(json.dumps(result))
            return Ack(message.header.seq, message.header.seq, True, message.header.round)

        def refused(self, error: Rejected) -> None:
            print(f"refused: {error}", flush=True)

    security = TlsCredentials.load(Path(credentials), RECEIVER)
    transport = GrpcTransport(
        RECEIVER, security=security, bulk_bytes=1 << 20, stream_deadline_s=900.0
    )
    address = transport.start(Checker())
    before = _status("VmRSS")
    ready.write_text(address)
    threading.Event().wait()


if __name__ == "__main__":
    serve(Path(sys.argv[2]), *sys.argv[3:])
