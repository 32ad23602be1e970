"""The README's transcripts and figures, made from real runs, and the check that they still
read as the code prints.

    python docs/readme_transcripts.py            # run the README's commands, rewrite its blocks
    python docs/readme_transcripts.py --check    # say where the README and the code disagree

Each block it owns follows a ``<!-- transcript: NAME -->`` line in README.md:

- ``run``: ``airgossip run`` (the default fleet) as it printed, its folder written as
  ``runs/<timestamp>`` (the default; the script gives it a scratch folder);
- ``consensus``: the pure-gossip commands, each comment's relative error from the run's
  ``results.json``;
- ``errors``: each ``$ airgossip ...`` line followed by what that command printed.

Writing runs the commands for real (a few minutes on 2 cores; the figures move with the
machine and its load). ``--check`` runs no fleet: it holds every error line to what the CLI
prints for that command and the run transcript's banner and summary rows, numbers aside, to
what the code renders (``tests/system/test_readme_transcripts.py`` runs it in the suite).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARK = re.compile(r"^<!-- transcript: (?P<name>[\w-]+) -->\n```(?P<lang>\w*)\n", re.M)
#: Where the default run's folder is shown to be (``airgossip run`` without ``--out``).
DEFAULT_OUT = "runs/<timestamp>"
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?")


def blocks(text: str) -> dict[str, tuple[int, int]]:
    """Each owned block's name -> (start, end) of its body in ``text``."""
    found = {}
    for mark in MARK.finditer(text):
        end = text.index("```", mark.end())
        found[mark["name"]] = (mark.end(), end)
    return found


def body(text: str, name: str) -> str:
    start, end = blocks(text)[name]
    return text[start:end]


def replace(text: str, name: str, new_body: str) -> str:
    start, end = blocks(text)[name]
    return text[:start] + new_body.rstrip("\n") + "\n" + text[end:]


def airgossip(
    args: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``airgossip ARGS`` as a user runs it, at 80 columns, from the repository."""
    return subprocess.run(
        [sys.executable, "-m", "airgossip", *args], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "COLUMNS": "80", **(env or {})}, timeout=1800,
    )  # fmt: skip


# -- the error transcripts ------------------------------------------------------------------


def commands(block: str) -> list[tuple[list[str], list[str]]]:
    """``$ airgossip ARGS`` lines of a block, each with the lines shown after it."""
    out: list[tuple[list[str], list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ airgossip"):
            out.append((shlex.split(line)[2:], []))
        elif out:
            out[-1][1].append(line)
    return out


def write_errors(text: str) -> str:
    lines = []
    for args, _ in commands(body(text, "errors")):
        result = airgossip(args)
        lines += ["$ " + shlex.join(["airgossip", *args]), *result.stderr.strip().splitlines()]
    return replace(text, "errors", "\n".join(lines))


def check_errors(text: str) -> list[str]:
    """Each error line as the CLI prints it for its command (in this process: fast)."""
    from typer.testing import CliRunner

    from airgossip.cli import app

    problems = []
    for args, shown in commands(body(text, "errors")):
        result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        printed = result.stderr.strip().splitlines()
        if printed != shown:
            problems.append(f"`airgossip {shlex.join(args)}` prints {printed}, README {shown}")
    return problems


# -- the run transcript ---------------------------------------------------------------------


def write_run(text: str, scratch: Path) -> str:
    out = scratch / "run"
    result = airgossip(["run", "--out", str(out)])
    if result.returncode != 0:
        raise SystemExit(f"airgossip run failed:\n{result.stderr}")
    printed = (result.stdout + result.stderr).replace(str(out), DEFAULT_OUT)
    lines = [line.rstrip() for line in printed.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return replace(text, "run", "\n".join(["$ airgossip run", *lines]))


def shape(line: str) -> str:
    """A line with its numbers as ``N`` and its spaces collapsed: what the code decides."""
    return " ".join(NUMBER.sub("N", line).split())


def rendered_run() -> tuple[str, list[str]]:
    """The banner and summary rows the code prints for the default run (numbers made up:
    only the shape is compared)."""
    from rich.console import Console

    from airgossip.cli.display import run_banner, summary_table
    from airgossip.emulation.fleets import preflight
    from airgossip.scenario.config import load_config
    from airgossip.scenario.results import FinalFigures, RoundFigures, RunResults

    config = load_config(None, {})
    links = preflight(config).network.describe()
    banner = run_banner(config, links, Path(DEFAULT_OUT))
    figures = {"round": 40, "train_wall_s": 3.5, "mean_accuracy": 0.95, "min_accuracy": 0.94,
               "max_accuracy": 0.96, "consensus_distance": 0.004, "bytes_sent": 9_340_000,
               "messages_sent": 958, "messages_dropped": 94, "agents_reporting": 8}  # fmt: skip
    results = RunResults(
        config={**config.model_dump(mode="json"), "lambda2": 0.5},
        rounds=[RoundFigures(**figures)],
        final=FinalFigures(**figures, complete=True),
        total_wall_s=8.1,
    )
    console = Console(width=80, color_system=None, force_terminal=False, record=True)
    with console.capture() as captured:
        console.print(summary_table(results, Path(DEFAULT_OUT), links))
    return banner, [line for line in captured.get().splitlines() if line.strip()]


def check_run(text: str) -> list[str]:
    """The run transcript's banner and summary rows, numbers aside, as the code prints them."""
    lines = body(text, "run").splitlines()
    banner, rows = rendered_run()
    problems = []
    if lines[:1] != ["$ airgossip run"] or len(lines) < 2 or shape(lines[1]) != shape(banner):
        problems.append(f"the banner reads {lines[1:2]}, the code prints {banner!r}")
    start = next((i for i, line in enumerate(lines) if line.strip() == "airgossip run"), None)
    shown = [line for line in lines[start:] if line.strip()] if start is not None else []
    if [shape(line) for line in shown] != [shape(line) for line in rows]:
        problems.append(
            "the summary reads\n  " + "\n  ".join(shown) + "\nthe code prints\n  "
            + "\n  ".join(rows)
        )  # fmt: skip
    return problems


# -- the consensus figures ------------------------------------------------------------------


def write_consensus(text: str, scratch: Path) -> str:
    """Run each command of the block; its comment's relative error from its results."""
    block = body(text, "consensus").splitlines()
    out: list[str] = []
    i = 0
    while i < len(block):
        command = [block[i]]
        while command[-1].endswith("\\"):
            i += 1
            command.append(block[i])
        out += command
        i += 1
        if i < len(block) and block[i].startswith("#") and "relative error" in block[i]:
            args = shlex.split(" ".join(c.rstrip("\\") for c in command))[1:]
            folder = scratch / f"consensus-{len(out)}"
            result = airgossip([*args, "--out", str(folder)])
            if result.returncode != 0:
                raise SystemExit(f"{shlex.join(args)} failed:\n{result.stderr}")
            final = json.loads((folder / "results.json").read_text())["final"]
            figure = f"relative error {final['relative_error']:.1e}"
            out.append(re.sub(r"relative error \S+", figure, block[i]))
            i += 1
    return replace(text, "consensus", "\n".join(out))


def check(text: str) -> list[str]:
    """Every place the README's transcripts and the code disagree (empty: none)."""
    missing = [n for n in ("run", "consensus", "errors") if n not in blocks(text)]
    if missing:
        return [f"README.md has no transcript block {', '.join(missing)}"]
    return check_errors(text) + check_run(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare only; run no fleet")
    args = parser.parse_args()
    text = README.read_text()
    if args.check:
        problems = check(text)
        print("\n".join(problems) or "README transcripts match the code")
        raise SystemExit(1 if problems else 0)
    with tempfile.TemporaryDirectory(prefix="readme-") as scratch:
        text = write_errors(text)
        text = write_run(text, Path(scratch))
        text = write_consensus(text, Path(scratch))
    README.write_text(text)
    print(f"rewrote the transcripts of {README}")


if __name__ == "__main__":
    main()
