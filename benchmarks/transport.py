"""Transport: a 40 MB model (10M float32) pushed between two processes over loopback.

Four ways in the same run, each the median of several pushes of the same buffer:

* ``GrpcTransport`` in plaintext (our gossip transport: a client stream of chunks, the
  receiver reassembling into one buffer), to a receiver whose handler takes the message and
  acknowledges it (no decoding: the transport alone): the figure of the target;
* raw TCP: ``sendall`` of the buffer, ``recv_into`` a preallocated one, a 1-byte ack (the
  baseline: what the wire allows);
* ``GrpcTransport`` over mutual TLS (the default outside one machine; beside the target);
* torch.distributed's gloo ``send``/``recv`` of the tensor (the stretch baseline).

The first three take turns push by push (gRPC, raw TCP, gRPC over TLS, gRPC, ...), so a
change of the machine's load during the run weighs on each alike; gloo runs after them.
Beside MB/s, the CPU each push cost (this process's, the sender's, plus the receiver
process's): on a busy machine throughput follows it, and it moves far less with the load.

Target: GrpcTransport >= 60% of raw TCP's MB/s.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from benchmarks.proctree import cpu_seconds
from benchmarks.suite import Context, Outcome

NUMEL = 10_000_000
NBYTES = 4 * NUMEL


def _wait_for_file(path: Path, timeout_s: float = 120.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the receiver did not start within {timeout_s:.0f} s")
        time.sleep(0.02)
    time.sleep(0.05)
    return path.read_text().strip()


def _receiver(
    kind: str, ctx: Context, extra: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    ready = ctx.work / f"{kind}.ready"
    ready.unlink(missing_ok=True)
    log = (ctx.work / f"{kind}-receiver.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.transport", kind, str(ready), *(extra or [])],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    return process, _wait_for_file(ready)


#: One push: its wall seconds and the CPU seconds it cost sender and receiver together.
Push = Callable[[], tuple[float, float]]


def _timed(send: Callable[[], None], receiver: int) -> tuple[float, float]:
    cpu = time.process_time() + (cpu_seconds(receiver) or 0.0)
    began = time.perf_counter()
    send()
    seconds = time.perf_counter() - began
    return seconds, time.process_time() + (cpu_seconds(receiver) or 0.0) - cpu


@contextmanager
def grpc_sender(ctx: Context, secure: bool) -> Iterator[Push]:
    """A receiver process and a sender here; yields one push's seconds, as often as asked."""
    from edge.algorithms.base import Ack
    from edge.security.certificates import throwaway_fleet
    from edge.security.tls import TlsCredentials
    from edge.transport.base import GossipMessage, MessageHeader, SendOutcome
    from edge.transport.grpc_transport import GrpcTransport

    security, extra = None, []
    if secure:
        folder = throwaway_fleet(ctx.work / "certs", ["bench-sender", "bench-receiver"])
        security, extra = TlsCredentials.load(folder, "bench-sender"), [str(folder)]
    process, address = _receiver("grpc-tls" if secure else "grpc", ctx, extra)
    payload = np.random.default_rng(0).standard_normal(NUMEL, dtype=np.float32)
    data = memoryview(payload).cast("B")
    transport = GrpcTransport("bench-sender", security=security, send_timeout_s=120.0)
    seq = 0

    def send() -> None:
        nonlocal seq
        seq += 1
        header = MessageHeader(
            sender="bench-sender", round=seq, seq=seq, base_seq=0, algorithm="push-sum",
            codec="raw:float32", numel=NUMEL, payload_bytes=NBYTES,
        )  # fmt: skip
        done = threading.Event()
        outcome: list[SendOutcome] = []

        def finished(o: SendOutcome) -> None:
            outcome.append(o)
            done.set()

        transport.send("bench-receiver", address, GossipMessage(header, data), finished)
        done.wait()
        if not outcome[0].delivered:
            raise RuntimeError(f"push failed: {outcome[0].error}")
        assert isinstance(outcome[0].ack, Ack)

    try:
        yield lambda: _timed(send, process.pid)
    finally:
        transport.close()
        process.terminate()
        process.wait()


@contextmanager
def tcp_sender(ctx: Context) -> Iterator[Push]:
    process, port = _receiver("tcp", ctx)
    payload = np.random.default_rng(0).standard_normal(NUMEL, dtype=np.float32)
    try:
        with socket.create_connection(("127.0.0.1", int(port))) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def send() -> None:
                sock.sendall(memoryview(payload).cast("B"))
                if sock.recv(1) != b"k":
                    raise RuntimeError("raw TCP receiver did not acknowledge")

            yield lambda: _timed(send, process.pid)
    finally:
        process.terminate()
        process.wait()


def interleaved_rates(
    ctx: Context, pushes: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """MB/s and CPU milliseconds of each push of plaintext gRPC, raw TCP and gRPC over TLS,
    taking turns (the first push of each opens its connection and is not counted)."""
    rates: dict[str, list[float]] = {"grpc": [], "tcp": [], "grpc_tls": []}
    cpu_ms: dict[str, list[float]] = {name: [] for name in rates}
    with (
        grpc_sender(ctx, secure=False) as grpc_push,
        tcp_sender(ctx) as tcp_push,
        grpc_sender(ctx, secure=True) as tls_push,
    ):
        ways = {"grpc": grpc_push, "tcp": tcp_push, "grpc_tls": tls_push}
        for turn in range(pushes + 1):
            for name, push in ways.items():
                seconds, cpu = push()
                if turn:
                    rates[name].append(NBYTES / seconds / 1e6)
                    cpu_ms[name].append(1e3 * cpu)
    return rates, cpu_ms


def gloo_rates(ctx: Context, pushes: int) -> list[float]:
    import torch
    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process, _ = _receiver("gloo", ctx, [str(port), str(pushes + 1)])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)
    tensor = torch.randn(NUMEL)
    ack = torch.zeros(1)
    rates = []
    try:
        for i in range(pushes + 1):
            began = time.perf_counter()
            dist.send(tensor, dst=1)
            dist.recv(ack, src=1)
            if i:
                rates.append(NBYTES / (time.perf_counter() - began) / 1e6)
    finally:
        dist.destroy_process_group()
        process.wait(timeout=60)
    return rates


# -- receivers (run as python -m benchmarks.transport KIND READY_FILE) -------------------------
def serve_grpc(ready: Path, credentials: str | None = None) -> None:
    from edge.algorithms.base import Ack
    from edge.security.tls import TlsCredentials
    from edge.transport.base import GossipMessage, MessageHeader, Rejected
    from edge.transport.grpc_transport import GrpcTransport

    class Taker:
        def accepts(self, sender: str) -> None:
            pass

        def admit(self, header: MessageHeader) -> None:
            pass

        def deliver(self, message: GossipMessage) -> Ack:
            return Ack(message.header.seq, message.header.seq, True, message.header.round)

        def refused(self, error: Rejected) -> None:
            pass

    security = TlsCredentials.load(Path(credentials), "bench-receiver") if credentials else None
    transport = GrpcTransport("bench-receiver", security=security)
    address = transport.start(Taker())
    ready.write_text(address)
    threading.Event().wait()


def serve_tcp(ready: Path) -> None:
    buffer = bytearray(NBYTES)
    view = memoryview(buffer)
    with socket.create_server(("127.0.0.1", 0)) as server:
        ready.write_text(str(server.getsockname()[1]))
        conn, _ = server.accept()
        with conn:
            while True:
                got = 0
                while got < NBYTES:
                    n = conn.recv_into(view[got:], NBYTES - got)
                    if not n:
                        return
                    got += n
                conn.sendall(b"k")


def serve_gloo(ready: Path, port: str, pushes: str) -> None:
    import torch
    import torch.distributed as dist

    ready.write_text("gloo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2)
    tensor = torch.empty(NUMEL)
    for _ in range(int(pushes)):
        dist.recv(tensor, src=0)
        dist.send(torch.ones(1), dst=0)
    dist.destroy_process_group()


def run(ctx: Context) -> list[Outcome]:
    pushes = 3 if ctx.quick else 8
    figures: dict[str, object] = {"bytes": NBYTES, "pushes": pushes}
    rates, cpu_ms = interleaved_rates(ctx, pushes)
    try:
        rates["gloo"] = gloo_rates(ctx, pushes)
    except Exception as err:  # gloo may be missing from a torch build
        figures["gloo_error"] = repr(err)
    median = {name: statistics.median(r) for name, r in rates.items()}
    for name, r in rates.items():
        figures[f"{name}_mb_s"] = [round(x) for x in r]
        print(f"  {name}: median {median[name]:.0f} MB/s", flush=True)
    cpu = {name: statistics.median(ms) for name, ms in cpu_ms.items()}
    for name, ms in cpu_ms.items():
        figures[f"{name}_cpu_ms"] = [round(x, 1) for x in ms]
        print(f"  {name}: median {cpu[name]:.1f} ms of CPU a push", flush=True)
    grpc, tcp, tls = median["grpc"], median["tcp"], median["grpc_tls"]
    share = grpc / tcp
    figures.update(
        grpc_median=round(grpc), tcp_median=round(tcp), share_of_tcp=round(share, 3),
        grpc_tls_median=round(tls), tls_share_of_tcp=round(tls / tcp, 3),
        grpc_cpu_ms_median=round(cpu["grpc"], 1), tcp_cpu_ms_median=round(cpu["tcp"], 1),
        grpc_tls_cpu_ms_median=round(cpu["grpc_tls"], 1),
    )  # fmt: skip
    measured = (
        f"GrpcTransport {grpc:.0f} MB/s = {100 * share:.0f}% of raw TCP {tcp:.0f} MB/s "
        f"(over mutual TLS {tls:.0f} MB/s = {100 * tls / tcp:.0f}%); CPU a push "
        f"{cpu['grpc']:.0f} ms against raw TCP's {cpu['tcp']:.0f} ms (TLS {cpu['grpc_tls']:.0f} ms)"
    )
    gloo = median.get("gloo")
    if gloo is not None:
        figures.update(gloo_median=round(gloo), share_of_gloo=round(grpc / gloo, 3))
        measured += f"; gloo send/recv {gloo:.0f} MB/s (ours {100 * grpc / gloo:.0f}% of it)"
    return [
        Outcome(
            "transport",
            "40 MB push >= 60% of raw TCP in the same run (stretch: beside gloo)",
            measured,
            share >= 0.6,
            figures,
        )
    ]


if __name__ == "__main__":
    kind, ready_path = sys.argv[1], Path(sys.argv[2])
    receivers = {"grpc": serve_grpc, "grpc-tls": serve_grpc, "tcp": serve_tcp, "gloo": serve_gloo}
    receivers[kind](ready_path, *sys.argv[3:])
    print(json.dumps({"done": kind}))
