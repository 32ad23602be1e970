"""Against the peers, same task: our fleet, Flower, hivemind, p2pfl and no framework.

See :mod:`benchmarks.peers` for the task and how each contender is measured. Goal: ahead of
every framework on time to 0.90 and on bytes, within 1.5x of the no-framework time (eight
models trained one epoch each on their shards, then exactly averaged: FedAvg in one process),
and a peak PSS at or under p2pfl's.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from airgossip.emulation.fleets.processes import JsonLinesTail
from benchmarks.peers import venvs
from benchmarks.peers.plain import TARGET_ACCURACY
from benchmarks.proctree import TreeCost, run_watched
from benchmarks.suite import Context, Outcome

ROOT = Path(__file__).resolve().parent.parent
PEERS = Path(__file__).resolve().parent / "peers"
AGENTS, HIDDEN, LR, MOMENTUM, BATCH = 8, 64, 0.1, 0.9, 32
FLOWER_APP = ROOT / "examples" / "flower-digits"


def write_split(path: Path, seed: int = 0) -> None:
    """Our digits task's own IID split (the same call the agents make), for every contender."""
    from airgossip.edge.tasks.digits import DigitsOptions, load_digits_arrays, split_indices

    x, y = load_digits_arrays()
    test, shards = split_indices(y, AGENTS, seed, DigitsOptions(partition="iid"))
    arrays: dict[str, Any] = {
        "agents": AGENTS, "hidden": HIDDEN, "lr": LR, "momentum": MOMENTUM, "batch_size": BATCH,
        "x_test": x[test], "y_test": y[test],
    }  # fmt: skip
    for i, shard in enumerate(shards):
        arrays[f"x_shard_{i}"], arrays[f"y_shard_{i}"] = x[shard], y[shard]
    np.savez(path, **arrays)


def our_config(path: Path, rounds: int) -> None:
    path.write_text(
        f"""agents = {AGENTS}
topology = "exponential"
algorithm = "push-sum"
rounds = {rounds}
seed = 0

[task]
name = "digits"
partition = "iid"
hidden = {HIDDEN}
lr = {LR}
momentum = {MOMENTUM}
batch_size = {BATCH}
local_epochs = 1
lr_decay_at = 1.0

[network]
loss = 0.0
"""
    )


#: Seconds without a new record after which a contender that began recording is stopped.
STALL_S = 120.0


@dataclass
class Stamper:
    """Stamps every JSON line appended to files matching ``pattern`` in ``folder`` with the
    time it was first seen (polled every 50 ms)."""

    folder: Path
    pattern: str
    seen: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    _tails: dict[Path, JsonLinesTail] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def poll(self) -> None:
        now = time.time()
        for path in self.folder.glob(self.pattern):
            tail = self._tails.setdefault(path, JsonLinesTail(path))
            self.seen += [(now, row) for row in tail.read()]

    def stalled(self) -> str | None:
        """Why the contender will not finish by itself: no new record for
        :data:`STALL_S` since its last one (p2pfl's nodes, having declared each other dead,
        stop short of the last round); None while it records, or has not begun to."""
        if not self.seen:
            return None
        quiet = time.time() - self.seen[-1][0]
        if quiet < STALL_S:
            return None
        return f"stopped: no new record for {quiet:.0f} s (stalled after {len(self.seen)} records)"

    def __enter__(self) -> Stamper:
        def loop() -> None:
            while not self._stop.wait(0.05):
                self.poll()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()


#: (agent, round, accuracy, unix time known)
Row = tuple[str, int, float, float]


@dataclass
class Contender:
    name: str
    how: str
    command: list[str]
    folder: Path
    pattern: str
    rows: Callable[[list[tuple[float, dict[str, Any]]]], list[Row]]
    own_bytes: Callable[[], int | None] = lambda: None
    env: dict[str, str] | None = None
    data_note: str = ""


def _event_rows(seen: list[tuple[float, dict[str, Any]]]) -> list[Row]:
    return [
        (str(d["agent"]), int(d["round"]), float(d["accuracy"]), float(d["t"])) for _, d in seen
    ]


def _our_rows(seen: list[tuple[float, dict[str, Any]]]) -> list[Row]:
    return [
        (d["agent_id"], int(d["round"]), float(d["metrics"]["accuracy"]), t)
        for t, d in seen
        if d.get("round", 0) > 0 and "accuracy" in d.get("metrics", {})
    ]


def _flower_rows(seen: list[tuple[float, dict[str, Any]]]) -> list[Row]:
    out: list[Row] = []
    for t, d in seen:
        for i, acc in enumerate(d.get("accuracies") or []):
            out.append((str(i), int(d["round"]), float(acc), t))
    return out


def _results_bytes(folder: Path) -> Callable[[], int | None]:
    def read() -> int | None:
        try:
            return int(json.loads((folder / "results.json").read_text())["final"]["bytes_sent"])
        except (OSError, KeyError, ValueError, TypeError):
            return None

    return read


def time_to_target(rows: list[Row], launched: float) -> tuple[int | None, float | None, float]:
    """First round whose mean accuracy over all peers reached the target, when that was
    known (seconds after launch), and the best mean accuracy of any complete round."""
    by_round: dict[int, dict[str, tuple[float, float]]] = defaultdict(dict)
    for agent, round_index, acc, t in rows:
        by_round[round_index][agent] = (acc, t)
    best = 0.0
    for round_index in sorted(by_round):
        peers = by_round[round_index]
        if len(peers) < AGENTS:
            continue
        mean = sum(a for a, _ in peers.values()) / len(peers)
        best = max(best, mean)
        if mean >= TARGET_ACCURACY:
            return round_index, max(t for _, t in peers.values()) - launched, best
    return None, None, best


def contenders(ctx: Context, rounds: int) -> list[Contender | tuple[str, str]]:
    """Every contender that can run here; ``(name, why not)`` for those that cannot."""
    split = ctx.work / "digits-split.npz"
    write_split(split)
    out: list[Contender | tuple[str, str]] = []
    ours = ctx.work / "ours"
    our_config(ctx.work / "ours.toml", rounds)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out.append(Contender(
        "airgossip", "8 agent processes, push-sum on the exponential graph, real gRPC, "
        "an embedded coordinator",
        [sys.executable, "-m", "airgossip", "run", "--config", str(ctx.work / "ours.toml"),
         "--out", str(ours)],
        ours / "agents", "*.jsonl", _our_rows, _results_bytes(ours), env,
    ))  # fmt: skip
    nf = ctx.work / "noframework"
    nf.mkdir()
    out.append(Contender(
        "no framework", "one process, 8 models, exact average each round",
        [sys.executable, str(PEERS / "noframework.py"), str(split), str(nf / "events.jsonl"),
         str(rounds)],
        nf, "events.jsonl", _event_rows,
    ))  # fmt: skip
    if ctx.quick:
        return out
    flower = ctx.work / "flower"
    out.append(Contender(
        "Flower FedAvg", "the example app's ServerApp (FedAvg) on Flower's simulation "
        "engine (Ray), 8 supernodes",
        [sys.executable, "-m", "airgossip", "baseline", "flower", str(FLOWER_APP),
         "--agents", str(AGENTS), "--rounds", str(rounds), "--out", str(flower)],
        flower, "rounds.jsonl", _flower_rows, _results_bytes(flower), env,
        data_note="the app's own split: each node tests on 20% of its partition",
    ))  # fmt: skip
    for name, script, how in (
        ("hivemind", "hivemind_peers.py", "8 processes, DecentralizedAverager all-reduce "
         "over its DHT (libp2p)"),
        ("p2pfl", "p2pfl_peers.py", "8 nodes in one process (as its examples run), gRPC, "
         "ring, FedAvg"),
    ):  # fmt: skip
        try:
            python = venvs.ensure(name, ctx.venvs, ctx.work / f"venv-{name}.log")
        except (venvs.VenvError, OSError, TimeoutError) as err:
            out.append((name, f"its environment could not be made here: {err}"))
            continue
        folder = ctx.work / name
        folder.mkdir()
        out.append(Contender(
            f"{name}", how,
            [str(python), str(PEERS / script), str(split), str(folder / "events.jsonl"),
             str(rounds)],
            folder, "events.jsonl", _event_rows,
        ))  # fmt: skip
    return out


def verdict_of(*checks: bool | None) -> bool | None:
    """Met where every check passed; not met where one failed; not measured (None) where
    none failed but one could not be made (its contender did not run)."""
    if any(check is False for check in checks):
        return False
    return None if any(check is None for check in checks) else True


def _mb(n: int | None) -> str:
    return "–" if n is None else f"{n / 1e6:.1f} MB"


def run(ctx: Context) -> list[Outcome]:
    rounds = 15
    measured: dict[str, dict[str, Any]] = {}
    for contender in contenders(ctx, rounds):
        if isinstance(contender, tuple):
            name, why = contender
            measured[name] = {"ran": False, "why": why}
            continue
        print(f"  {contender.name}: {contender.how}", flush=True)
        log = ctx.work / f"{contender.name.replace(' ', '-')}.log"
        launched = time.time()
        with Stamper(contender.folder, contender.pattern) as stamps:
            try:
                cost: TreeCost | None = run_watched(
                    contender.command, log_path=log, env=contender.env, cwd=ctx.work,
                    timeout_s=600, stalled=stamps.stalled,
                )  # fmt: skip
            except TimeoutError as err:
                cost = None
                why = str(err)
        rows = contender.rows(stamps.seen)
        round_hit, seconds, best = time_to_target(rows, launched)
        figures: dict[str, Any] = {
            "ran": cost is not None and cost.returncode == 0,
            "how": contender.how,
            "rounds_run": max((r[1] for r in rows), default=0),
            "round_reaching_target": round_hit,
            "seconds_to_target": None if seconds is None else round(seconds, 2),
            "best_mean_accuracy": round(best, 4),
            "data": contender.data_note or "our digits split (IID shards, one test set)",
            "log": str(log),
        }
        if cost is not None:
            figures.update(
                wall_s=round(cost.wall_s, 2), cpu_s=round(cost.cpu_s, 1),
                peak_pss_bytes=cost.peak_pss_bytes, processes=cost.processes,
                loopback_bytes=cost.loopback_bytes, own_count_bytes=contender.own_bytes(),
                returncode=cost.returncode,
            )  # fmt: skip
            if cost.stopped is not None:
                figures["why"] = cost.stopped
        else:
            figures["why"] = why
        measured[contender.name] = figures
        print(f"    {json.dumps(figures)}", flush=True)
    return outcomes(measured)


def outcomes(measured: dict[str, dict[str, Any]]) -> list[Outcome]:
    ours, floor = measured["airgossip"], measured["no framework"]
    rows = []
    for name, f in measured.items():
        if not f.get("ran") and "why" in f and "wall_s" not in f:
            rows.append(f"| {name} | did not run: {f['why']} | | | | |")
            continue
        t = f.get("seconds_to_target")
        reached = (
            f"{t:.1f} s (round {f['round_reaching_target']})"
            if t is not None
            else (f"not reached in {f['rounds_run']} rounds (best {f['best_mean_accuracy']:.3f})")
        )
        if not f.get("ran") and "why" in f:
            reached += f"; {f['why']}"
        rows.append(
            f"| {name} | {reached} | {_mb(f.get('loopback_bytes'))} | "
            f"{_mb(f.get('own_count_bytes'))} | {f.get('peak_pss_bytes', 0) / 2**20:.0f} MiB | "
            f"{f.get('cpu_s', 0):.1f} s |"
        )
    table = (
        "| contender | time from launch to 0.90 | loopback bytes | framework's own count | "
        "peak PSS | CPU |\n|---|---|---|---|---|---|\n" + "\n".join(rows)
    )
    our_t, floor_t = ours.get("seconds_to_target"), floor.get("seconds_to_target")
    frameworks = {k: v for k, v in measured.items() if k not in ("airgossip", "no framework")}
    ahead_time = all(
        v.get("seconds_to_target") is None
        or (our_t is not None and our_t < v["seconds_to_target"])
        for v in frameworks.values() if v.get("ran")
    )  # fmt: skip
    our_bytes = ours.get("loopback_bytes")
    ahead_bytes = our_bytes is not None and all(
        v.get("loopback_bytes") is None or our_bytes < v["loopback_bytes"]
        for v in frameworks.values() if v.get("ran")
    )  # fmt: skip
    ran = [k for k, v in frameworks.items() if v.get("ran")]
    within = our_t is not None and floor_t is not None and our_t <= 1.5 * floor_t
    leaner = measured.get("p2pfl", {})
    our_pss, leanest = ours.get("peak_pss_bytes"), leaner.get("peak_pss_bytes")
    lean = None if not leaner.get("ran") else (
        our_pss is not None and leanest is not None and our_pss <= leanest
    )  # fmt: skip
    goal = (
        "ahead of every framework on time and bytes; within 1.5x of no framework; peak PSS "
        "at or under p2pfl's (one process for all its nodes)"
    )
    # With no framework run (--quick, or each failed) there is nothing to be ahead of.
    met = verdict_of(
        ahead_time if ran else None, ahead_bytes if ran else None, within, lean
    )  # fmt: skip
    ratio = f"{our_t / floor_t:.2f}x" if our_t and floor_t else "–"
    memory = (
        f"{our_pss / 2**20:.0f} vs {leanest / 2**20:.0f} MiB"
        if our_pss is not None and leanest is not None
        else "p2pfl did not run"
    )
    measured_text = (
        f"ours {our_t} s vs no framework {floor_t} s ({ratio}); ahead on time of "
        f"{'all' if ahead_time else 'not all'} of {', '.join(ran) or 'none'}; on loopback "
        f"bytes: {'yes' if ahead_bytes else 'no'}; peak PSS against p2pfl: {memory}"
    )
    return [Outcome("peers", goal, measured_text, met, {"contenders": measured, "table": table})]
