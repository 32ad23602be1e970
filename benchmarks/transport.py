"""Transport: a 40 MB model (10M float32) pushed between two processes over loopback.

Three ways in the same run, each the median of several pushes of the same buffer:

* ``GrpcTransport`` (our gossip transport: a client stream of chunks, the receiver
  reassembling into one buffer), to a receiver whose handler takes the message and
  acknowledges it (no decoding: the transport alone);
* raw TCP: ``sendall`` of the buffer, ``recv_into`` a preallocated one, a 1-byte ack (the
  baseline: what the wire allows);
* torch.distributed's gloo ``send``/``recv`` of the tensor (the stretch baseline).

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
from pathlib import Path

import numpy as np

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


def grpc_rates(ctx: Context, pushes: int) -> list[float]:
    from edge.algorithms.base import Ack
    from edge.transport.base import GossipMessage, MessageHeader, SendOutcome
    from edge.transport.grpc_transport import GrpcTransport

    process, address = _receiver("grpc", ctx)
    payload = np.random.default_rng(0).standard_normal(NUMEL, dtype=np.float32)
    data = memoryview(payload).cast("B")
    transport = GrpcTransport("bench-sender", send_timeout_s=120.0)
    rates = []
    try:
        for seq in range(1, pushes + 2):
            header = MessageHeader(
                sender="bench-sender", round=seq, seq=seq, base_seq=0, algorithm="push-sum",
                codec="raw:float32", numel=NUMEL, payload_bytes=NBYTES,
            )  # fmt: skip
            done = threading.Event()
            outcome: list[SendOutcome] = []

            def finished(
                o: SendOutcome, outcome: list[SendOutcome] = outcome, done: threading.Event = done
            ) -> None:
                outcome.append(o)
                done.set()

            began = time.perf_counter()
            transport.send("bench-receiver", address, GossipMessage(header, data), finished)
            done.wait()
            seconds = time.perf_counter() - began
            if not outcome[0].delivered:
                raise RuntimeError(f"push failed: {outcome[0].error}")
            assert isinstance(outcome[0].ack, Ack)
            if seq > 1:  # the first opens the connection
                rates.append(NBYTES / seconds / 1e6)
    finally:
        transport.close()
        process.terminate()
        process.wait()
    return rates


def tcp_rates(ctx: Context, pushes: int) -> list[float]:
    process, port = _receiver("tcp", ctx)
    payload = np.random.default_rng(0).standard_normal(NUMEL, dtype=np.float32)
    rates = []
    try:
        with socket.create_connection(("127.0.0.1", int(port))) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(pushes + 1):
                began = time.perf_counter()
                sock.sendall(memoryview(payload).cast("B"))
                if sock.recv(1) != b"k":
                    raise RuntimeError("raw TCP receiver did not acknowledge")
                if i:
                    rates.append(NBYTES / (time.perf_counter() - began) / 1e6)
    finally:
        process.terminate()
        process.wait()
    return rates


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
def serve_grpc(ready: Path) -> None:
    from edge.algorithms.base import Ack
    from edge.transport.base import GossipMessage, MessageHeader, Rejected
    from edge.transport.grpc_transport import GrpcTransport

    class Taker:
        def admit(self, header: MessageHeader) -> None:
            pass

        def deliver(self, message: GossipMessage) -> Ack:
            return Ack(message.header.seq, message.header.seq, True, message.header.round)

        def refused(self, error: Rejected) -> None:
            pass

    transport = GrpcTransport("bench-receiver")
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
    rates = {}
    for name, measure in (("grpc", grpc_rates), ("tcp", tcp_rates), ("gloo", gloo_rates)):
        try:
            rates[name] = measure(ctx, pushes)
        except Exception as err:  # gloo may be missing from a torch build
            figures[f"{name}_error"] = repr(err)
            continue
        figures[f"{name}_mb_s"] = [round(r) for r in rates[name]]
        print(f"  {name}: median {statistics.median(rates[name]):.0f} MB/s", flush=True)
    grpc = statistics.median(rates["grpc"])
    tcp = statistics.median(rates["tcp"])
    share = grpc / tcp
    gloo = statistics.median(rates["gloo"]) if "gloo" in rates else None
    figures.update(grpc_median=round(grpc), tcp_median=round(tcp), share_of_tcp=round(share, 3))
    measured = f"GrpcTransport {grpc:.0f} MB/s = {100 * share:.0f}% of raw TCP {tcp:.0f} MB/s"
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
    {"grpc": serve_grpc, "tcp": serve_tcp, "gloo": serve_gloo}[kind](ready_path, *sys.argv[3:])
    print(json.dumps({"done": kind}))
