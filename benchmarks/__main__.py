"""Every performance target against its baseline, measured in one run.

    python -m benchmarks                   # everything (about 25 minutes on 2 cores)
    python -m benchmarks --quick           # the laptop subset (a few minutes)
    python -m benchmarks --only transport,scale
    python -m benchmarks --venvs DIR       # where the peer frameworks' environments live

Writes ``benchmarks.md`` (the table, the machine, each entry's own table) and
``benchmarks.json`` (every figure) into ``--out`` (default ``runs/bench-<timestamp>``), and
prints the markdown. Every ratio's baseline is measured in the same run; nothing is copied
in. The benchmarks are not part of the test suite.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import time
import traceback
from pathlib import Path

from benchmarks import machine
from benchmarks.suite import Context, Outcome, verdict

#: name -> module with ``run(ctx) -> list[Outcome]``, in the order they run.
ENTRIES = {
    "transport": "benchmarks.transport",
    "bulk-threshold": "benchmarks.bulk_threshold",
    "large-push": "benchmarks.large_push",
    "startup": "benchmarks.startup",
    "scale": "benchmarks.scale",
    "overlap": "benchmarks.overlap",
    "mixing": "benchmarks.mixing",
    "regressions": "benchmarks.regressions",
    "rejoin": "benchmarks.rejoin",
    "detection": "benchmarks.detection",
    "peers": "benchmarks.comparison",
    "privacy": "benchmarks.privacy",
    "attacks": "benchmarks.attacks",
    "drift": "benchmarks.drift",
    "uneven": "benchmarks.heterogeneous",
    "host-threads": "benchmarks.host_threads",
    "ray-mode": "benchmarks.ray_mode",
    "ray-recovery": "benchmarks.ray_recovery",
}


def markdown(host: dict[str, object], outcomes: list[Outcome], seconds: float, quick: bool) -> str:
    lines = [
        f"Machine: {machine.markdown(host)}.",
        f"Run: {'--quick' if quick else 'full'}, {seconds / 60:.1f} minutes.",
        "",
        "| target | goal | measured (baseline in the same run) | verdict |",
        "|---|---|---|---|",
    ]
    for o in outcomes:
        note = f" ({o.note})" if o.note else ""
        lines.append(f"| {o.target} | {o.goal} | {o.measured}{note} | {verdict(o.met)} |")
    for o in outcomes:
        table = o.figures.get("table")
        if table:
            lines += ["", f"**{o.target}**", "", str(table)]
    return "\n".join(lines) + "\n"


def write(
    out: Path, host: dict[str, object], outcomes: list[Outcome], seconds: float, quick: bool
) -> str:
    """Write ``benchmarks.md`` and ``benchmarks.json``; return the markdown."""
    text = markdown(host, outcomes, seconds, quick)
    (out / "benchmarks.md").write_text(text)
    (out / "benchmarks.json").write_text(json.dumps({
        "machine": host, "quick": quick, "seconds": round(seconds, 1),
        "outcomes": [o.to_json() for o in outcomes],
    }, indent=2) + "\n")  # fmt: skip
    return text


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="the laptop subset")
    parser.add_argument("--only", default="", help=f"comma-separated: {', '.join(ENTRIES)}")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--venvs", type=Path, default=Path.home() / ".cache" / "airgossip" / "bench-venvs",
        help="virtual environments of the peer frameworks (made when missing, else reused)",
    )  # fmt: skip
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(ENTRIES)
    unknown = [n for n in names if n not in ENTRIES]
    if unknown:
        choices = ", ".join(ENTRIES)
        parser.exit(2, f"error: unknown entry {', '.join(unknown)}; choose from {choices}\n")
    out = args.out or Path("runs") / time.strftime("bench-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    args.venvs.mkdir(parents=True, exist_ok=True)
    host = machine.describe()
    started = time.perf_counter()
    outcomes: list[Outcome] = []
    text = ""
    for name in names:
        print(f"[{name}]", flush=True)
        # Each entry's runs, logs and profiles stay beside the table (out/work/NAME).
        work = (out / "work" / name).resolve()
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        ctx = Context(quick=args.quick, work=work, venvs=args.venvs.resolve())
        try:
            outcomes += importlib.import_module(ENTRIES[name]).run(ctx)
        except Exception as err:  # one entry failing must not lose the others' figures
            traceback.print_exc()
            outcomes.append(Outcome(name, "", f"the entry failed: {err!r}", None))
        # Written after every entry: an interrupted run keeps what it measured.
        text = write(out, host, outcomes, time.perf_counter() - started, args.quick)
    print(text)
    print(f"written: {out / 'benchmarks.md'}, {out / 'benchmarks.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
