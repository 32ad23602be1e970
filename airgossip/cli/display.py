"""What the CLI shows: errors, the progress of a fleet, the summary table of a run.

Everything the CLI prints that holds words from elsewhere (settings, paths, errors, ids)
goes out as plain text, never as rich markup: a ``[peers]`` or ``[network]`` in it is a word,
not a style tag to be swallowed. Tables fit 80 columns and read the same when piped.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # the CLI imports torch and the fleets only when a command needs them
    from pydantic import JsonValue

    from airgossip.emulation.fleets import FleetProgress
    from airgossip.scenario.config import RunConfig
    from airgossip.scenario.results import RunResults

console = Console()
errors = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print one error line and exit with ``code`` (2: bad input, 1: the run failed)."""
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def say(text: str, *, err: bool = False) -> None:
    """Print one line of plain text (no markup: brackets are words), unwrapped."""
    (errors if err else console).print(text, markup=False, highlight=False, soft_wrap=True)


def fmt(value: Any, digits: int = 4) -> str:
    """A figure for people: ``–`` for missing, short floats."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if (abs(value) < 1e-3 and value) else f"{value:.{digits}f}"
    return str(value)


#: Seconds after which a run's progress also says its pace and what is left.
LONG_RUN_S = 20.0


class ProgressDisplay:
    """A progress bar of a fleet's slowest round (a line every few seconds when the output
    is not a terminal)."""

    def __init__(self, rounds: int, *, gossip_only: bool) -> None:
        self.gossip_only = gossip_only
        self.progress = Progress(
            TextColumn("{task.description}", style="bold", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}", markup=False),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.bar = self.progress.add_task("starting", total=rounds, status="")
        self._last_print = 0.0
        self._started: tuple[float, int, int] | None = None

    def __enter__(self) -> ProgressDisplay:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def update(self, p: FleetProgress) -> None:
        if p.registered < p.agents:
            description, status = "starting agents", f"{p.registered}/{p.agents} registered"
        else:
            description = "gossiping" if self.gossip_only else "training"
            acc = f"acc {p.mean_accuracy:.3f} · " if p.mean_accuracy is not None else ""
            status = f"{acc}{p.messages_dropped}/{p.messages_sent} msgs lost"
            status += self._pace(p)
        self.progress.update(self.bar, completed=p.slowest_round, description=description,
                             status=status)  # fmt: skip
        line = f"{description}: round {p.slowest_round}/{p.rounds_total} {status}"
        if not console.is_terminal and time.monotonic() - self._last_print > 5:
            self._last_print = time.monotonic()
            console.print(line, markup=False, highlight=False)

    def _pace(self, p: FleetProgress) -> str:
        """Messages a second, the emulated clock and what is left, once a run has taken
        :data:`LONG_RUN_S`."""
        now = time.monotonic()
        if self._started is None:
            self._started = (now, p.slowest_round, p.messages_sent)
            return ""
        began, first_round, first_messages = self._started
        spent = now - began
        if spent < LONG_RUN_S or p.slowest_round <= first_round:
            return ""  # a short run's bar keeps to the rounds and losses (80 columns)
        pace = f" · {(p.messages_sent - first_messages) / spent:,.0f} msgs/s"
        if p.emulated_s is not None:
            pace += f" · emulated {p.emulated_s:.1f} s"
        left = spent / (p.slowest_round - first_round) * (p.rounds_total - p.slowest_round)
        return pace + f" · about {left:.0f} s left"

    def notice(self, text: str) -> None:
        """A line above the bar (what a backend could not apply, where metrics are)."""
        self.progress.console.print(text, markup=False, highlight=False, soft_wrap=True)


def run_banner(config: RunConfig, links: str, out_dir: Path) -> str:
    """The line ``airgossip run`` starts with: the fleet, its links, where results go."""
    task = task_label(config.task.model_dump(), private=config.privacy.enabled)
    return (
        f"airgossip: {config.agents} agents · {links} · {config.algorithm} · task "
        f"{task} · {config.mode} · out {out_dir}"
    )


def task_label(task: JsonValue, *, private: bool = False) -> str:
    """A run's task (its settings) for people: its name, or the Flower app it runs; for a
    private run (``private``) with the step size it trains at (``digits, lr 4``: a private
    run's default differs from the task's own, docs/privacy.md)."""
    if not isinstance(task, dict):
        return str(task)
    if task.get("name") == "flower":
        return f"flower app {task.get('app')}"
    lr = task.get("lr")
    if private and isinstance(lr, int | float) and not isinstance(lr, bool):
        return f"{task['name']}, lr {lr:g}"
    return str(task["name"])


def summary_table(
    results: RunResults, out_dir: Path, links: str, *, title: str = "airgossip run"
) -> Table:
    """The end-of-run table: fleet, figures, messages, output. ``links``: what the links
    were (``link loss 0.1``, ``wireless lte-urban``)."""
    final, config = results.final, results.config
    table = Table(
        title=Text(title), show_header=False, title_justify="left", box=box.SIMPLE, padding=(0, 1)
    )
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    rows: list[tuple[str, Any]] = [
        (
            "fleet",
            f"{config['agents']} agents · {config['topology']} · {config['algorithm']} · "
            + ("" if config["compression"] == "none" else f"{config['compression']} · ")
            + f"{config['mode']}",
        ),
        ("task", task_label(config["task"], private=results.privacy is not None)),
        ("mixing |λ2|", fmt(config["lambda2"], 3)),
        ("rounds", f"{final.round} of {config['rounds']}"),
        *_agent_rows(results),
    ]
    if final.mean_accuracy is not None:
        rows.append(
            (
                "test accuracy",
                f"mean {fmt(final.mean_accuracy)} (min {fmt(final.min_accuracy)}, "
                f"max {fmt(final.max_accuracy)})",
            )
        )
    elif final.mean_loss is not None:
        rows.append(("test loss", f"mean {fmt(final.mean_loss)}"))
    if final.relative_error is not None:
        rows.append(("relative error", f"{final.relative_error:.3e}"))
    rows += [
        *_privacy_rows(results),
        ("consensus distance", fmt(final.consensus_distance)),
        ("messages", f"{final.messages_sent} sent, {final.messages_dropped} lost ({links})"),
        ("bytes sent", f"{final.bytes_sent / 1e6:.2f} MB"),
        *_energy_rows(results),
        *_wireless_rows(results),
        ("wall time", _wall_time(results)),
        ("results", str(out_dir / "results.json")),
    ]
    for key, value in rows:
        table.add_row(key, Text(str(value)))
    return table


def _energy_rows(results: RunResults) -> list[tuple[str, Any]]:
    """What the agents spent ([[device_classes]] that draw power): ``energy  1.9 J an agent
    (max 1.9), 1 battery spent``."""
    final = results.final
    if final.mean_energy_j is None or final.max_energy_j is None:
        return []
    n = final.agents_depleted or 0
    spent = f", {n} {'battery' if n == 1 else 'batteries'} spent" if n else ""
    return [("energy", f"{final.mean_energy_j:.1f} J an agent (max {final.max_energy_j:.1f})"
                       f"{spent}")]  # fmt: skip


def _wall_time(results: RunResults) -> str:
    """The run's whole time and, beside it, the part its agents' rounds took (results.json:
    ``total_wall_s`` and ``final.train_wall_s``; virtual time in the virtual mode)."""
    rounds = results.final.train_wall_s
    virtual = " virtual" if results.config.get("mode") == "virtual" else ""
    return f"{results.total_wall_s:.1f} s (rounds: {rounds:.1f} s{virtual})"


def write_summary(
    path: Path, results: RunResults, out_dir: Path, links: str, *, title: str = "airgossip run"
) -> None:
    """The summary table as plain text at 80 columns (``summary.txt``), a private file."""
    from airgossip.common.security.private_files import open_private

    with open_private(path, "w") as handle:
        Console(file=handle, width=80, color_system=None, force_terminal=False).print(
            summary_table(results, out_dir, links, title=title)
        )


def _agent_rows(results: RunResults) -> list[tuple[str, Any]]:
    """How each agent of a coordinator's run ended (``4 finished``, ``3 finished, 1 dead``)."""
    if results.run is None:
        return []
    states: dict[str, int] = {}
    for state in results.run.agents.values():
        states[state] = states.get(state, 0) + 1
    run = results.run
    return [
        ("agents", ", ".join(f"{n} {state}" for state, n in sorted(states.items()))),
        (
            "lost messages",
            f"{run.messages_emulated_drops} dropped by emulated links, {run.messages_failed} "
            "refused or unreachable",
        ),
    ]


def _wireless_rows(results: RunResults) -> list[tuple[str, Any]]:
    w = results.wireless
    if w is None:
        return []
    return [
        (
            "wireless links",
            f"{fmt(w.mean_radio_links, 1)} radio, {fmt(w.mean_gossip_links, 1)} "
            f"gossip (mean) · {w.graph_epochs} graphs · strongly connected "
            f"{fmt(w.strongly_connected_share, 2)} of rounds · "
            f"{fmt(w.emulated_s, 1)} s emulated",
        )
    ]


def _privacy_rows(results: RunResults) -> list[tuple[str, Any]]:
    """``dp-sgd · epsilon 2.99 (most any agent spent) at delta 1e-05`` and, for network DP,
    the pairs; for the central reference, that it protects nothing from neighbours."""
    p = results.privacy
    if p is None:
        return []
    spent = "–" if p.epsilon is None else f"{p.epsilon:.3g}"
    if p.pairwise is not None:
        line = (
            f"{p.mechanism} · ε mean {p.pairwise.mean:.3g} over pairs, worst pair {spent} "
            f"at δ {p.delta:g}"
        )
    else:
        line = f"{p.mechanism} · ε {spent} (most any agent spent) at δ {p.delta:g}"
    if p.gossip_rounds > 1:
        line += f" · a private step every {p.gossip_rounds} rounds"
    from airgossip.edge.privacy.mechanisms.registry import MECHANISMS  # no torch: names and flags

    mechanism = MECHANISMS.get(p.mechanism)
    if mechanism is not None and mechanism.caveat:
        line += f" · {mechanism.caveat}"
    if p.adversary == "eavesdropper":
        line += " · against an eavesdropper that is no agent (an agent learns more)"
    if p.exhausted_agents:
        line += f" · budget stopped {p.exhausted_agents} agents"
    return [("privacy", line)]
