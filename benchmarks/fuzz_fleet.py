"""Fuzzed push streams against a live fleet: crashes, non-finite parameters, memory, threads.

Run from the repository root (about two minutes on 2 cores)::

    python -m benchmarks.fuzz_fleet                      # 8,000 streams to a fleet of 4
    python -m benchmarks.fuzz_fleet --streams 10000 --agents 6 --out fuzz.md

A coordinator and ``--agents`` agent processes (consensus, mutual TLS with a throwaway
authority, checkpoints on) gossip on the exponential graph with 10% loss. Once they run, the
fuzzer sends ``--streams`` push streams, each broken in at least one way (random bytes; a
header with a bent field: another sender than the certificate, another receiver or fleet,
sequence 2^64-1, non-finite or huge values, weights <= 0, wrong shape or codec; streams cut
short or too long; plaintext connections), to random agents, with the certificate of one of
the target's in-neighbours (a compromised member) or of a stranger to the fleet, plus garbage
calls to the coordinator. It samples every process's resident memory and thread count as it
goes, and measures the fleet's gossip rate (rounds per second, all agents) before, during and
after: the ratios are against the undisturbed rate measured in the same run.

The report (markdown) gives: streams sent and how they ended (gRPC codes), crashed
processes, agents whose latest estimate holds a non-finite value, the relative error of the
fleet's consensus against the exact average after the fuzzing, and memory and threads at the
start and end of the fuzzing. Every figure comes from the run that prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from airgossip.common.security.certificates import throwaway_fleet
from airgossip.common.security.tls import COORDINATOR_IDENTITY, TlsCredentials, dial, fleet_of
from airgossip.edge.agent import fleet_digest
from airgossip.edge.observability.stats import read_records
from airgossip.edge.tasks import TaskContext, load_task
from airgossip.edge.tasks.consensus import ConsensusOptions, true_average
from airgossip.edge.transport import MessageHeader
from airgossip.edge.transport.wire import header_to_proto
from airgossip.protos import gossip_pb2

DIM = 16
SEED = 7
SCENARIO = f"""\
agents = {{agents}}
rounds = 10000000
seed = {SEED}
wait_timeout_s = 0.25
[task]
name = "consensus"
dim = {DIM}
[network]
loss = 0.1
"""
#: Header fields bent so that the message must be refused (or, for a stale seq, ignored).
BENT: dict[str, list[Any]] = {
    "sender": ["", "agent-0", "agent-1", "mallory", "x" * 300],
    "receiver": ["", "agent-9", "coordinator"],
    "fleet": ["", "another-fleet"],
    "algorithm": ["dpsgd", "", "push-sum "],
    "fleet_digest": ["", "0" * 16],
    "numel": [0, DIM - 1, DIM + 1, 2**40, 2**64 - 1],
    "codec": ["bogus", "", "qsgd:99"],
    "seq": [2**64 - 1, 2**48 + 1],
    "round": [2**64 - 1],
    "base_seq": [2**63],
    "y": [0.0, -5.0, float("nan"), float("inf"), 1e300],
    "values": [float("nan"), float("inf"), 1.7e308, 1e300],
    "length": ["short", "long"],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def status(pid: int) -> tuple[float, int]:
    """(resident memory in MB, threads) of a live process."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


class LiveFleet:
    """A coordinator and agents as processes, over mutual TLS, in a temporary folder."""

    def __init__(self, folder: Path, agents: int) -> None:
        self.folder = folder
        self.ids = [f"agent-{i}" for i in range(agents)]
        self.certs = throwaway_fleet(folder / "certs", [*self.ids, COORDINATOR_IDENTITY, "mallory"])
        self.scenario = folder / "scenario.toml"
        self.scenario.write_text(SCENARIO.format(agents=agents))
        self.port, self.metrics_port = free_port(), free_port()
        self.stats = folder / "stats"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPC_VERBOSITY": "ERROR"}
        self._spawn(
            "coordinator",
            ["coordinator", "--listen", f"127.0.0.1:{self.port}", "--metrics-port",
             str(self.metrics_port), "--config", str(self.scenario), "--topology", "exponential",
             "--certs", str(self.certs)],
            env,
        )  # fmt: skip
        for index, agent_id in enumerate(self.ids):
            self._spawn(
                agent_id,
                ["agent", "--config", str(self.scenario), "--index", str(index),
                 "--coordinator", f"127.0.0.1:{self.port}", "--certs", str(self.certs),
                 "--stats-dir", str(self.stats), "--checkpoint-dir",
                 str(folder / "checkpoints" / agent_id), "--threads", "1",
                 "--parent-pid", str(os.getpid())],
                env,
            )  # fmt: skip

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> None:
        log = (self.folder / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "airgossip", *args], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip

    def fleet_json(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.metrics_port}/fleet"
        with urllib.request.urlopen(url, timeout=5) as reply:
            data: dict[str, Any] = json.loads(reply.read())
            return data

    def rounds(self) -> dict[str, int]:
        out = {}
        for agent_id in self.ids:
            records = read_records(self.stats, agent_id)
            out[agent_id] = records[-1].round if records else 0
        return out

    def rate(self, seconds: float) -> float:
        """Rounds per second of the whole fleet over ``seconds``."""
        first, began = self.rounds(), time.monotonic()
        time.sleep(seconds)
        last = self.rounds()
        return sum(last[a] - first[a] for a in self.ids) / (time.monotonic() - began)

    def log_tail(self, name: str) -> str:
        lines = (self.folder / f"{name}.log").read_text(errors="replace").splitlines()
        return " | ".join(lines[-5:])

    def dead(self) -> list[str]:
        return [name for name, p in self.processes.items() if p.poll() is not None]

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class Fuzzer:
    """Broken push streams and coordinator calls, from one seed."""

    def __init__(self, fleet: LiveFleet, seed: int) -> None:
        self.fleet = fleet
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        info = fleet.fleet_json()
        self.addresses = {m["agent_id"]: m["address"] for m in info["members"]}
        self.in_neighbours: dict[str, list[str]] = {a: [] for a in fleet.ids}
        for sender, receiver in info["edges"][0]:
            self.in_neighbours[receiver].append(sender)
        self.security = {
            who: TlsCredentials.load(fleet.certs, who) for who in [*fleet.ids, "mallory"]
        }
        self.fleet_name = fleet_of(self.security["mallory"])
        self.digest = ""
        self._channels: dict[tuple[str, str], grpc.Channel] = {}
        self.outcomes: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        #: Broken pushes the agents absorbed anyway (should stay 0: an OK reply to one of
        #: them may only be a stale duplicate, ignored).
        self.absorbed = 0

    def channel(self, identity: str, target: str) -> grpc.Channel:
        key = (identity, target)
        with self.lock:
            if key not in self._channels:
                self._channels[key] = dial(self.addresses[target], target, self.security[identity])
            return self._channels[key]

    def _message(self, rng: random.Random, sender: str, target: str) -> list[bytes]:
        """A push from ``sender`` to ``target``, valid but for one bent field (or two)."""
        bent = {
            name: rng.choice(BENT[name]) for name in rng.sample(sorted(BENT), rng.randint(1, 2))
        }
        values = [rng.gauss(0, 1) for _ in range(DIM)]
        if "values" in bent:
            values[rng.randrange(DIM)] = bent["values"]
        data = np.array(values, dtype=np.float64).tobytes()
        fields: dict[str, Any] = dict(
            sender=sender, receiver=target, round=rng.randint(1, 1000),
            seq=rng.randint(1, 1000), base_seq=0, algorithm="push-sum", codec="float64",
            numel=DIM, payload_bytes=len(data), scalars={"y": rng.uniform(0.05, 1)},
            fleet_digest=self.digest, fleet=self.fleet_name, epoch=1,
        )  # fmt: skip
        for name, value in bent.items():
            if name == "y":
                fields["scalars"] = {"y": value}
            elif name in fields:
                fields[name] = value
        if bent.get("length") == "short":
            data = data[: len(data) // 2]
        elif bent.get("length") == "long":
            data = data + data
        header = header_to_proto(MessageHeader(**fields))
        split = rng.randrange(len(data) + 1)
        first = gossip_pb2.PushChunk(header=header, data=data[:split]).SerializeToString()
        rest = [gossip_pb2.PushChunk(data=data[split:]).SerializeToString()] if data[split:] else []
        return [first, *rest]

    def one(self, n: int) -> None:
        with self.lock:
            rng = random.Random(self.rng.random())
        target = rng.choice(self.fleet.ids)
        member = rng.random() < 0.7 and self.in_neighbours[target]
        identity = rng.choice(self.in_neighbours[target]) if member else "mallory"
        kind = rng.choice(["garbage", "bent", "bent", "bent", "coordinator", "plaintext"])
        try:
            if kind == "garbage":
                stream = [bytes(rng.getrandbits(8) for _ in range(rng.randrange(200)))
                          for _ in range(rng.randint(1, 3))]  # fmt: skip
                self.channel(identity, target).stream_unary("/airgossip.v1.Gossip/Push")(
                    iter(stream), timeout=15
                )
            elif kind == "bent":
                stream = self._message(rng, identity, target)
                reply = self.channel(identity, target).stream_unary("/airgossip.v1.Gossip/Push")(
                    iter(stream), timeout=15
                )
                if gossip_pb2.PushAck.FromString(reply).absorbed:
                    with self.lock:
                        self.absorbed += 1
            elif kind == "coordinator":
                with dial(f"127.0.0.1:{self.fleet.port}", COORDINATOR_IDENTITY,
                          self.security[identity]) as channel:  # fmt: skip
                    method = rng.choice(["Register", "Heartbeat", "Leave"])
                    garbage = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 200)))
                    channel.unary_unary(f"/airgossip.v1.Coordinator/{method}")(garbage, timeout=15)
            else:
                with grpc.insecure_channel(self.addresses[target]) as channel:
                    channel.stream_unary("/airgossip.v1.Gossip/Push")(iter([b"x"]), timeout=15)
            code = "OK"
        except grpc.RpcError as err:
            code = err.code().name
        with self.lock:
            self.kinds[kind] += 1
            self.outcomes[code] += 1

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8000)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4, help="fuzzer client threads")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="airgossip-fuzz-") as tmp:
        fleet = LiveFleet(Path(tmp), args.agents)
        try:
            deadline = time.monotonic() + 180
            while min(fleet.rounds().values()) < 20:
                if time.monotonic() > deadline or fleet.dead():
                    logs = {n: fleet.log_tail(n) for n in fleet.dead()}
                    raise SystemExit(f"the fleet did not start: {logs}")
                time.sleep(0.5)
            fuzzer = Fuzzer(fleet, seed=SEED)
            fuzzer.digest = read_digest(fleet)
            baseline = fleet.rate(10.0)
            samples: dict[str, list[tuple[float, int]]] = {p: [] for p in fleet.processes}

            def sample() -> None:
                for name, process in fleet.processes.items():
                    if process.poll() is None:
                        samples[name].append(status(process.pid))

            sample()
            before, started = fleet.rounds(), time.monotonic()
            with ThreadPoolExecutor(args.threads) as pool:
                for start in range(0, args.streams, 500):
                    list(pool.map(fuzzer.one, range(start, min(args.streams, start + 500))))
                    sample()
            fuzz_s = time.monotonic() - started
            during = sum(fleet.rounds()[a] - before[a] for a in fleet.ids) / fuzz_s
            fuzzer.close()
            after = fleet.rate(10.0)
            sample()
            report = summarise(args, fleet, fuzzer, samples, fuzz_s, baseline, during, after)
        finally:
            fleet.close()
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n")


def read_digest(fleet: LiveFleet) -> str:
    """The fleet's task digest, as its agents compute it."""
    task = load_task("consensus", TaskContext(0, len(fleet.ids), SEED, options={"dim": DIM}))
    return fleet_digest(task, task.initial_parameters())


def summarise(
    args: argparse.Namespace,
    fleet: LiveFleet,
    fuzzer: Fuzzer,
    samples: dict[str, list[tuple[float, int]]],
    fuzz_s: float,
    baseline: float,
    during: float,
    after: float,
) -> str:
    target = true_average(SEED, len(fleet.ids), ConsensusOptions(dim=DIM)).numpy()
    non_finite, errors = 0, []
    for agent_id in fleet.ids:
        records = [r for r in read_records(fleet.stats, agent_id) if r.estimate is not None]
        estimate = records[-1].estimate
        assert estimate is not None
        non_finite += int(not np.isfinite(estimate).all())
        errors.append(float(np.linalg.norm(estimate - target) / np.linalg.norm(target)))
    lines = [
        f"## Fuzzed streams against a live fleet ({len(fleet.ids)} agents, mutual TLS)",
        "",
        "| figure | value |",
        "|---|---|",
        f"| streams and calls sent | {sum(fuzzer.kinds.values()):,} in {fuzz_s:.1f} s "
        f"({sum(fuzzer.kinds.values()) / fuzz_s:.0f}/s, {args.threads} client threads) |",
        "| by kind | " + ", ".join(f"{k} {v:,}" for k, v in sorted(fuzzer.kinds.items())) + " |",
        f"| push streams (bent, garbage, plaintext) | "
        f"{sum(fuzzer.kinds[k] for k in ('bent', 'garbage', 'plaintext')):,} |",
        "| how they ended | "
        + ", ".join(f"{k} {v:,}" for k, v in fuzzer.outcomes.most_common())
        + " |",
        f"| broken pushes absorbed | {fuzzer.absorbed} |",
        f"| crashed processes | {len(fleet.dead())} of {len(fleet.processes)} |",
        f"| agents with a non-finite parameter | {non_finite} of {len(fleet.ids)} |",
        f"| consensus relative error after (max over agents) | {max(errors):.2e} |",
        f"| fleet rounds/s: undisturbed, during, after | {baseline:.1f}, {during:.1f} "
        f"({during / baseline:.2f}x), {after:.1f} ({after / baseline:.2f}x) |",
    ]
    lines.append(
        "| per process: RSS MB at the start, after the first 1,000 streams, at the end; "
        "threads at the start, most, at the end | |"
    )
    for name, points in samples.items():
        rss = [p[0] for p in points]  # sampled every 500 streams
        threads = [p[1] for p in points]
        warm = rss[min(2, len(rss) - 1)]
        lines.append(
            f"| {name} | {rss[0]:.1f}, {warm:.1f}, {rss[-1]:.1f} MB; {threads[0]}, "
            f"{max(threads)}, {threads[-1]} threads |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
