"""Transport: a flat float32 model pushed between two processes over loopback.

For each size (40 MB, 100 MB and 400 MB), every way in the same run, each the median of several
pushes of the same buffer:

* raw TCP: ``sendall`` of the buffer, ``recv_into`` a preallocated one, a 1-byte ack (the
  baseline: what the wire allows);
* raw TLS: the same over Python's ``ssl``, mutual, with the same certificates as the gRPC
  transport over TLS (the baseline over TLS);
* ``GrpcTransport`` in plaintext and over mutual TLS (our gossip transport), to a receiver
  whose handler takes the message and acknowledges it (no decoding: the transport alone);
* ``GrpcTransport`` on the bulk path (``bulk_bytes``: the payload over a data connection the
  call negotiates, :mod:`airgossip.edge.transport.bulk`), in plaintext and over mutual TLS;
* torch.distributed's gloo ``send``/``recv`` of the tensor (a peer's figure);
* at 100 MB, hivemind 1.1.12's ``DecentralizedAverager``: an all-reduce of the tensor
  between two peers, matchmaking left out (``peers/hivemind_tensor.py``, in hivemind's own
  environment); it moves the tensor's size out of each peer and into it, where a push
  moves it one way, so its MB/s (of the tensor) is not a push's.

The ways that take turns (all but gloo) push one after the other (gRPC, raw TCP, ...), so a
change of the machine's load during the run weighs on each alike; gloo and hivemind run
after them.
Beside MB/s, the CPU each push cost (this process's, the sender's, plus the receiver
process's), also per byte: on a busy machine throughput follows it, and it moves far less
with the load.

Targets (issue 36, for the transport as it comes, with no setting given): in plaintext
>= 80% of raw TCP, over mutual TLS >= 70% of raw TLS, in the same run. The ways over the call
and on the bulk path alone are measured beside it (``default``, ``grpc``, ``bulk`` and their
``_tls`` twins).
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
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from benchmarks.proctree import cpu_seconds
from benchmarks.suite import Context, Outcome

#: Sizes pushed (float32 elements) and the pushes of each in a full run and a quick one.
SIZES = {"40MB": 10_000_000, "100MB": 25_000_000, "400MB": 100_000_000}
PUSHES = {"40MB": (8, 3), "100MB": (4, 2), "400MB": (3, 2)}
#: The size hivemind's averager is measured at too (an all-reduce of two peers).
HIVEMIND_SIZE = "100MB"
SENDER, RECEIVER = "bench-sender", "bench-receiver"


def _wait_for_file(path: Path, timeout_s: float = 120.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the receiver did not start within {timeout_s:.0f} s")
        time.sleep(0.02)
    time.sleep(0.05)
    return path.read_text().strip()


def _receiver(
    kind: str, ctx: Context, numel: int, extra: list[str] | None = None,
    module: str = "benchmarks.transport", ready_name: str = "",
) -> tuple[subprocess.Popen[bytes], str]:  # fmt: skip
    ready = ctx.work / f"{ready_name or kind}-{numel}.ready"
    ready.unlink(missing_ok=True)
    log = (ctx.work / f"{ready_name or kind}-{numel}-receiver.log").open("wb")
    command = [sys.executable, "-m", module, kind, str(ready), str(numel)]
    process = subprocess.Popen(
        [*command, *(extra or [])],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    return process, _wait_for_file(ready)


def _certificates(ctx: Context) -> Path:
    from airgossip.common.security.certificates import throwaway_fleet

    folder = ctx.work / "certs"
    if not (folder / "ca.pem").exists():
        throwaway_fleet(folder, [SENDER, RECEIVER])
    return folder


#: One push: its wall seconds and the CPU seconds it cost sender and receiver together.
Push = Callable[[], tuple[float, float]]


def _timed(send: Callable[[], None], receiver: int) -> tuple[float, float]:
    cpu = time.process_time() + (cpu_seconds(receiver) or 0.0)
    began = time.perf_counter()
    send()
    seconds = time.perf_counter() - began
    return seconds, time.process_time() + (cpu_seconds(receiver) or 0.0) - cpu


@contextmanager
def _stopped(process: subprocess.Popen[bytes]) -> Iterator[None]:
    try:
        yield
    finally:
        process.terminate()
        process.wait()


#: ``bulk_bytes`` of the ways: every payload over the call, every payload on the bulk path,
#: and what the transport does when it is given nothing (both ends).
OVER_THE_CALL, ALWAYS_BULK, DEFAULT = 0, 1, -1


@contextmanager
def grpc_sender(
    ctx: Context, numel: int, secure: bool, bulk_bytes: int = DEFAULT
) -> Iterator[Push]:
    """A receiver process and a sender here, both with ``bulk_bytes`` (:data:`DEFAULT`: the
    transport's own default); yields one push's seconds, as often as asked."""
    from airgossip.common.security.tls import TlsCredentials
    from airgossip.edge.algorithms.base import Ack
    from airgossip.edge.transport.base import GossipMessage, MessageHeader, SendOutcome
    from airgossip.edge.transport.grpc_transport import GrpcTransport

    security, extra = None, []
    if secure:
        folder = _certificates(ctx)
        security, extra = TlsCredentials.load(folder, SENDER), [str(folder)]
    kind = f"grpc{bulk_bytes}" + ("-tls" if secure else "")
    process, address = _receiver("grpc", ctx, numel, [str(bulk_bytes), *extra], ready_name=kind)
    payload = np.random.default_rng(0).standard_normal(numel, dtype=np.float32)
    data = memoryview(payload).cast("B")
    transport = GrpcTransport(
        SENDER, security=security, send_timeout_s=600.0,
        bulk_bytes=None if bulk_bytes == DEFAULT else bulk_bytes,  # None: the default
    )  # fmt: skip
    seq = 0

    def send() -> None:
        nonlocal seq
        seq += 1
        header = MessageHeader(
            sender=SENDER, round=seq, seq=seq, base_seq=0, algorithm="push-sum",
            codec="raw:float32", numel=numel, payload_bytes=4 * numel,
        )  # fmt: skip
        done = threading.Event()
        outcome: list[SendOutcome] = []

        def finished(o: SendOutcome) -> None:
            outcome.append(o)
            done.set()

        transport.send(RECEIVER, address, GossipMessage(header, data), finished)
        done.wait()
        if not outcome[0].delivered:
            raise RuntimeError(f"push failed: {outcome[0].error}")
        assert isinstance(outcome[0].ack, Ack)

    try:
        with _stopped(process):
            yield lambda: _timed(send, process.pid)
    finally:
        transport.close()


@contextmanager
def socket_sender(ctx: Context, numel: int, secure: bool) -> Iterator[Push]:
    """Raw TCP, or raw mutual TLS with the transport's certificates (Python's ``ssl``)."""
    from airgossip.common.security.tls import TlsCredentials
    from airgossip.edge.transport.tlssocket import ssl_context

    folder = _certificates(ctx) if secure else None
    process, port = _receiver("tls" if secure else "tcp", ctx, numel, [str(folder or "")])
    payload = np.random.default_rng(0).standard_normal(numel, dtype=np.float32)
    with _stopped(process), socket.create_connection(("127.0.0.1", int(port))) as raw:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock: socket.socket = raw
        if folder is not None:
            context = ssl_context(TlsCredentials.load(folder, SENDER), server=False)
            sock = context.wrap_socket(raw)

        def send() -> None:
            sock.sendall(memoryview(payload).cast("B"))
            if sock.recv(1) != b"k":
                raise RuntimeError("raw socket receiver did not acknowledge")

        yield lambda: _timed(send, process.pid)


#: The ways that take turns: name -> how to start its sender.
WAYS: dict[str, Callable[[Context, int], object]] = {
    "tcp": lambda ctx, n: socket_sender(ctx, n, secure=False),
    "default": lambda ctx, n: grpc_sender(ctx, n, secure=False),
    "grpc": lambda ctx, n: grpc_sender(ctx, n, secure=False, bulk_bytes=OVER_THE_CALL),
    "bulk": lambda ctx, n: grpc_sender(ctx, n, secure=False, bulk_bytes=ALWAYS_BULK),
    "tls": lambda ctx, n: socket_sender(ctx, n, secure=True),
    "default_tls": lambda ctx, n: grpc_sender(ctx, n, secure=True),
    "grpc_tls": lambda ctx, n: grpc_sender(ctx, n, secure=True, bulk_bytes=OVER_THE_CALL),
    "bulk_tls": lambda ctx, n: grpc_sender(ctx, n, secure=True, bulk_bytes=ALWAYS_BULK),
}


def interleaved(
    ctx: Context, numel: int, pushes: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """MB/s and CPU seconds of each push of every way, taking turns (the first push of each
    opens its connection and is not counted)."""
    rates: dict[str, list[float]] = {name: [] for name in WAYS}
    cpu: dict[str, list[float]] = {name: [] for name in WAYS}
    with ExitStack() as stack:
        ways: dict[str, Push] = {
            name: stack.enter_context(start(ctx, numel))  # type: ignore[arg-type]
            for name, start in WAYS.items()
        }
        for turn in range(pushes + 1):
            for name, push in ways.items():
                seconds, used = push()
                if turn:
                    rates[name].append(4 * numel / seconds / 1e6)
                    cpu[name].append(used)
    return rates, cpu


def hivemind_rates(ctx: Context, numel: int, steps: int) -> tuple[list[float], list[float]]:
    """hivemind's ``DecentralizedAverager`` between two peers (its own environment, made
    under ``ctx.venvs`` when missing): MB/s of the tensor and CPU seconds a step."""
    from benchmarks.peers.venvs import ensure

    python = ensure("hivemind", ctx.venvs, ctx.work / "hivemind-venv.log")
    out = ctx.work / "hivemind-tensor.json"
    driver = Path(__file__).parent / "peers" / "hivemind_tensor.py"
    with (ctx.work / "hivemind-tensor.log").open("wb") as log:
        subprocess.run(
            [str(python), str(driver), str(numel), str(steps), str(out)],
            stdout=log, stderr=subprocess.STDOUT, check=True, timeout=900, cwd=ctx.work,
        )  # fmt: skip
    got = json.loads(out.read_text())
    return [4 * numel / t / 1e6 for t in got["seconds"]], list(got["cpu_s"])


def gloo_rates(ctx: Context, numel: int, pushes: int) -> tuple[list[float], list[float]]:
    import torch
    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process, _ = _receiver("gloo", ctx, numel, [str(port), str(pushes + 1)])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)
    tensor = torch.randn(numel)
    ack = torch.zeros(1)
    rates, cpu = [], []
    try:
        for i in range(pushes + 1):

            def send() -> None:
                dist.send(tensor, dst=1)
                dist.recv(ack, src=1)

            seconds, used = _timed(send, process.pid)
            if i:
                rates.append(4 * numel / seconds / 1e6)
                cpu.append(used)
    finally:
        dist.destroy_process_group()
        process.wait(timeout=120)
    return rates, cpu


# -- receivers (run as python -m benchmarks.transport KIND READY_FILE NUMEL ...) -------------
def serve_grpc(ready: Path, numel: str, bulk_bytes: str, credentials: str | None = None) -> None:
    from airgossip.common.security.tls import TlsCredentials
    from airgossip.edge.algorithms.base import Ack
    from airgossip.edge.transport.base import GossipMessage, MessageHeader, Rejected
    from airgossip.edge.transport.grpc_transport import GrpcTransport

    class Taker:
        def accepts(self, sender: str) -> None:
            pass

        def admit(self, header: MessageHeader) -> None:
            pass

        def deliver(self, message: GossipMessage) -> Ack:
            return Ack(message.header.seq, message.header.seq, True, message.header.round)

        def refused(self, error: Rejected) -> None:
            pass

    security = TlsCredentials.load(Path(credentials), RECEIVER) if credentials else None
    transport = GrpcTransport(
        RECEIVER, security=security, stream_deadline_s=600.0,
        bulk_bytes=None if int(bulk_bytes) == DEFAULT else int(bulk_bytes),
    )  # fmt: skip
    address = transport.start(Taker())
    ready.write_text(address)
    threading.Event().wait()


def serve_socket(ready: Path, numel: str, credentials: str = "") -> None:
    from airgossip.common.security.tls import TlsCredentials
    from airgossip.edge.transport.tlssocket import ssl_context

    nbytes = 4 * int(numel)
    view = memoryview(bytearray(nbytes))
    with socket.create_server(("127.0.0.1", 0)) as server:
        ready.write_text(str(server.getsockname()[1]))
        conn, _ = server.accept()
        if credentials:
            context = ssl_context(TlsCredentials.load(Path(credentials), RECEIVER), server=True)
            conn = context.wrap_socket(conn, server_side=True)
        with conn:
            while True:
                got = 0
                while got < nbytes:
                    n = conn.recv_into(view[got:], nbytes - got)
                    if not n:
                        return
                    got += n
                conn.sendall(b"k")


def serve_gloo(ready: Path, numel: str, port: str, pushes: str) -> None:
    import torch
    import torch.distributed as dist

    ready.write_text("gloo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2)
    tensor = torch.empty(int(numel))
    for _ in range(int(pushes)):
        dist.recv(tensor, src=0)
        dist.send(torch.ones(1), dst=0)
    dist.destroy_process_group()


def measure(ctx: Context, size: str) -> Outcome:
    numel, pushes = SIZES[size], PUSHES[size][ctx.quick]
    nbytes = 4 * numel
    figures: dict[str, object] = {"bytes": nbytes, "pushes": pushes}
    rates, cpu = interleaved(ctx, numel, pushes)
    try:
        rates["gloo"], cpu["gloo"] = gloo_rates(ctx, numel, pushes)
    except Exception as err:  # gloo may be missing from a torch build
        figures["gloo_error"] = repr(err)
    if size == HIVEMIND_SIZE:
        try:
            rates["hivemind"], cpu["hivemind"] = hivemind_rates(ctx, numel, pushes)
        except Exception as err:  # no environment, no network to make one
            figures["hivemind_error"] = repr(err)[:300]
    mb_s = {name: statistics.median(r) for name, r in rates.items()}
    ns_byte = {name: 1e9 * statistics.median(s) / nbytes for name, s in cpu.items()}
    for name in rates:
        figures[f"{name}_mb_s"] = [round(x) for x in rates[name]]
        figures[f"{name}_cpu_ns_per_byte"] = [round(1e9 * s / nbytes, 3) for s in cpu[name]]
        print(
            f"  {size} {name}: median {mb_s[name]:.0f} MB/s, {ns_byte[name]:.2f} ns CPU/byte",
            flush=True,
        )
    figures.update({f"{n}_median_mb_s": round(v) for n, v in mb_s.items()})
    figures.update({f"{n}_median_cpu_ns_per_byte": round(v, 3) for n, v in ns_byte.items()})
    share, tls_share = mb_s["grpc"] / mb_s["tcp"], mb_s["grpc_tls"] / mb_s["tls"]
    bulk, bulk_tls = mb_s["bulk"] / mb_s["tcp"], mb_s["bulk_tls"] / mb_s["tls"]
    default, default_tls = mb_s["default"] / mb_s["tcp"], mb_s["default_tls"] / mb_s["tls"]
    figures.update(
        share_of_tcp=round(share, 3), tls_share_of_tls=round(tls_share, 3),
        bulk_share_of_tcp=round(bulk, 3), bulk_tls_share_of_tls=round(bulk_tls, 3),
        default_share_of_tcp=round(default, 3), default_tls_share_of_tls=round(default_tls, 3),
    )  # fmt: skip
    measured = "; ".join(
        f"{name} {mb_s[name]:.0f} MB/s ({ns_byte[name]:.2f} ns CPU/B)" for name in rates
    )
    measured += (
        f"; default settings: plaintext {100 * default:.0f}% of raw TCP, mutual TLS "
        f"{100 * default_tls:.0f}% of raw TLS; over the call: {100 * share:.0f}%, "
        f"{100 * tls_share:.0f}%; bulk path: {100 * bulk:.0f}%, {100 * bulk_tls:.0f}%"
    )
    return Outcome(
        f"transport {size}",
        f"{size} push with default settings: plaintext >= 80% of raw TCP, mutual TLS >= 70% "
        "of raw TLS, same run",
        measured,
        default >= 0.8 and default_tls >= 0.7,
        figures,
        note=f"load average at the end: {os.getloadavg()[0]:.1f}",
    )


def run(ctx: Context) -> list[Outcome]:
    return [measure(ctx, size) for size in SIZES]


if __name__ == "__main__":
    kind, ready_path = sys.argv[1], Path(sys.argv[2])
    receivers: dict[str, Callable[..., None]] = {
        "grpc": serve_grpc, "tcp": serve_socket, "tls": serve_socket, "gloo": serve_gloo,
    }  # fmt: skip
    receivers[kind](ready_path, *sys.argv[3:])
    print(json.dumps({"done": kind}))
