"""Large push: a 2.5 GB float32 model pushed between two processes over the bulk path.

The receiver is a ``GrpcTransport`` with the bulk path in a process of its own, whose
handler checks the payload (CRC-32 against the sender's) and reports its memory: the peak
resident set (``VmHWM``) against the resident set before the push. The target (issue 23):
the receiver's peak RSS growth at most 1.3x the model's size. Over mutual TLS, as fleets
run by default. Then the same push again with its data connection cut at half (the
sender's socket closed after half the payload): it must resume (only the second half sent
again) and arrive bit for bit.
"""

from __future__ import annotations

import functools
import json
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from airgossip.edge.transport.base import SendOutcome
from benchmarks.suite import Context, Outcome
from benchmarks.transport import RECEIVER, SENDER, _certificates, _receiver, _stopped

NUMEL = 625_000_000  # 2.5 GB of float32


def _status(field: str) -> int:
    """A ``kB`` field of this process's ``/proc/self/status``, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return 1024 * int(line.split()[1])
    return 0


def _finish(outcome: list[SendOutcome], done: threading.Event, o: SendOutcome) -> None:
    outcome.append(o)
    done.set()


def _cut_at_half(attempts: list[int]) -> Callable[..., None]:
    """``send_payload`` whose first data connection ends after half the payload (the
    socket closed, as a link that went down), then the real one."""
    from airgossip.edge.transport import bulk_send

    real = bulk_send.send_payload

    def send(host: str, port: int, token: bytes, data: memoryview, **kw: Any) -> None:
        attempts.append(len(data))
        if len(attempts) > 1:
            return real(host, port, token, data, **kw)
        sock = socket.create_connection((host, port))
        if kw["context"] is not None:
            sock = kw["context"].wrap_socket(sock)
        sock.sendall(token)
        sock.sendall(data[: len(data) // 2])
        sock.close()
        raise ConnectionResetError("the link went down at half the payload")

    return send


def run(ctx: Context) -> list[Outcome]:
    from airgossip.common.security.tls import TlsCredentials
    from airgossip.edge.transport import bulk_send
    from airgossip.edge.transport.base import GossipMessage, MessageHeader
    from airgossip.edge.transport.grpc_transport import GrpcTransport

    folder = _certificates(ctx)
    report = ctx.work / "large-push"
    process, address = _receiver(
        "large", ctx, NUMEL, [str(folder), str(report)], "benchmarks.large_push"
    )
    payload = np.random.default_rng(0).random(NUMEL, dtype=np.float32)
    data = memoryview(payload).cast("B")
    crc = zlib.crc32(data)
    security = TlsCredentials.load(folder, SENDER)
    transport = GrpcTransport(SENDER, security=security, send_timeout_s=900.0, bulk_bytes=1 << 20)
    seconds, attempts = [], []
    with _stopped(process):
        for seq in (1, 2):  # the second one cut at half
            if seq == 2:
                real, bulk_send.send_payload = bulk_send.send_payload, _cut_at_half(attempts)
            header = MessageHeader(
                sender=SENDER, round=seq, seq=seq, base_seq=0, algorithm="push-sum",
                codec="raw:float32", numel=NUMEL, payload_bytes=4 * NUMEL,
            )  # fmt: skip
            outcome: list[SendOutcome] = []
            done = threading.Event()
            began = time.perf_counter()
            message = GossipMessage(header, data)
            transport.send(RECEIVER, address, message, functools.partial(_finish, outcome, done))
            done.wait()
            seconds.append(time.perf_counter() - began)
            if not outcome[0].delivered:
                raise RuntimeError(f"push {seq} failed: {outcome[0].error}")
        bulk_send.send_payload = real
        transport.close()
    got = [json.loads(Path(f"{report}.{seq}").read_text()) for seq in (1, 2)]
    growth = (got[0]["peak_rss"] - got[0]["rss_before"]) / (4 * NUMEL)
    exact = got[0]["crc"] == crc
    resumed = got[1]["crc"] == crc and attempts == [4 * NUMEL, 2 * NUMEL]
    figures = {
        "bytes": 4 * NUMEL, "seconds": [round(x, 2) for x in seconds], "crc_equal": exact,
        "rss_growth_ratio": round(growth, 3), "uninterrupted": got[0], "cut_at_half": got[1],
        "cut_attempt_bytes": attempts, "resumed_equal": resumed,
    }  # fmt: skip
    measured = (
        f"2.5 GB over mutual TLS in {seconds[0]:.1f} s ({4 * NUMEL / seconds[0] / 1e6:.0f} MB/s); "
        f"receiver's peak RSS growth {growth:.2f}x the model; payload CRC-32 "
        + ("equal" if exact else "DIFFERENT")
        + f"; cut at half: resumed in {seconds[1]:.1f} s, bytes sent per attempt {attempts}, "
        + f"CRC-32 {'equal' if got[1]['crc'] == crc else 'DIFFERENT'}, receiver's peak RSS "
        + f"{got[1]['peak_rss'] / 1e9:.2f} GB (after the first push {got[0]['peak_rss'] / 1e9:.2f})"
    )
    return [
        Outcome(
            "large push",
            "2.5 GB float32 between two agents: receiver's peak RSS growth <= 1.3x; cut at "
            "half, it resumes and arrives bit for bit",
            measured,
            growth <= 1.3 and exact and resumed,
            figures,
        )
    ]


def serve(ready: Path, numel: str, credentials: str, report: str) -> None:
    from airgossip.common.security.tls import TlsCredentials
    from airgossip.edge.algorithms.base import Ack
    from airgossip.edge.transport.base import GossipMessage, MessageHeader, Rejected
    from airgossip.edge.transport.grpc_transport import GrpcTransport

    class Checker:
        def accepts(self, sender: str) -> None:
            pass

        def admit(self, header: MessageHeader) -> None:
            pass

        def deliver(self, message: GossipMessage) -> Ack:
            peak = _status("VmHWM")
            result = {"rss_before": before, "peak_rss": peak, "crc": zlib.crc32(message.data),
                      "refused": list(refusals)}  # fmt: skip
            Path(f"{report}.{message.header.seq}").write_text(json.dumps(result))
            return Ack(message.header.seq, message.header.seq, True, message.header.round)

        def refused(self, error: Rejected) -> None:
            refusals.append(error.kind)
            print(f"refused: {error}", flush=True)

    refusals: list[str] = []

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
