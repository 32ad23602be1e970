"""``airgossip baseline``: the same app run by another system, beside our runs.

``airgossip baseline flower PATH`` runs a Flower app with Flower's own simulation engine
and the app's own ServerApp, and writes results.json in our schema
(``airgossip.emulation.baselines.flower``); ``airgossip compare`` reads it as it reads our runs.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from airgossip.cli.display import ProgressDisplay, console, errors, fail, fmt
from airgossip.cli.flower import app_spec, parse_run_config_flag
from airgossip.cli.run import _raise_keyboard_interrupt
from airgossip.cli.scenario import default_out

if TYPE_CHECKING:
    from airgossip.emulation.fleets import FleetProgress

#: The extra that holds Flower's simulation engine, and the module that says it is there.
EXTRA, ENGINE_MODULE = "baseline", "ray"
#: The checkout's lock, when airgossip runs from one (its .venv): an extra installed on first
#: use takes the versions it pins, as every other distribution there did.
LOCK = Path(__file__).resolve().parents[2] / "requirements" / "dev.lock"

baseline_app = typer.Typer(
    help="Run an app with another system's own runtime, written as our results.",
    no_args_is_help=True,
)


@baseline_app.command("flower")
def flower(
    app: Annotated[str, typer.Argument(show_default=False)],
    agents: Annotated[
        int, typer.Option(help="Simulated nodes, one partition each, as agents have.")
    ] = 8,
    rounds: Annotated[
        int | None, typer.Option(help="Server rounds (default: the app's num-server-rounds).")
    ] = None,
    run_config: Annotated[
        str | None,
        typer.Option(help="Run config overrides, as flwr run takes them ('k=v ...')."),
    ] = None,
    accuracy_metric: Annotated[
        str | None,
        typer.Option(help="The app's accuracy metric (default: accuracy, else eval_acc)."),
    ] = None,
    loss_metric: Annotated[
        str | None, typer.Option(help="The app's loss metric (default: loss, else eval_loss).")
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed of the ServerApp's initial model (as airgossip run's).")
    ] = 0,
    client_cpus: Annotated[
        float, typer.Option(help="CPUs Ray reserves per ClientApp (how many run at once).")
    ] = 1.0,
    out: Annotated[
        Path | None, typer.Option(help="Output folder (default: runs/<timestamp>).")
    ] = None,
) -> None:
    """Run a Flower app on Flower's simulation engine with its own ServerApp (FedAvg for a
    quickstart app): the centralized baseline of a serverless run.

    APP is the Flower app's project folder (with its pyproject.toml).
    """
    check_baseline_flags(app, agents, rounds, client_cpus)
    ensure_simulation_engine()
    from airgossip.emulation.baselines import BaselineError, FlowerBaseline, run_flower_baseline
    from airgossip.scenario.config import ConfigError

    spec = FlowerBaseline(
        app=app_spec(app), agents=agents, rounds=rounds,
        run_config=parse_run_config_flag(run_config), accuracy_metric=accuracy_metric,
        loss_metric=loss_metric, seed=seed, client_cpus=client_cpus,
    )  # fmt: skip
    out_dir = out or default_out()
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    console.print(
        f"flower baseline: {app} · {agents} nodes · Flower's simulation engine · out {out_dir}",
        highlight=False,
    )
    try:
        with ProgressDisplay(rounds or 0, gossip_only=False) as display:
            results = run_flower_baseline(spec, out_dir, on_progress=following_total(display))
    except ConfigError as err:
        fail(str(err))
    except BaselineError as err:
        fail(str(err), code=1)
    except KeyboardInterrupt:
        errors.print(f"interrupted: Flower stopped; partial results in {out_dir}")
        raise typer.Exit(130) from None
    final, config = results.final, results.config
    table = Table(title="flower baseline", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in (
        ("runtime", f"Flower simulation engine · {config['server_app']} · {agents} nodes"),
        ("rounds", f"{final.round} of {config['rounds']}"),
        ("test accuracy", f"mean {fmt(final.mean_accuracy)} (min {fmt(final.min_accuracy)}, "
                          f"max {fmt(final.max_accuracy)})"),
        ("messages", f"{final.messages_sent} to and from the server, "
                     f"{final.messages_dropped} failed"),
        ("bytes moved", f"{final.bytes_sent / 1e6:.2f} MB"),
        ("wall time", f"{results.total_wall_s:.1f} s"),
        ("results", str(out_dir / "results.json")),
    ):  # fmt: skip
        table.add_row(key, value)
    console.print(table)


def check_baseline_flags(app: str, agents: int, rounds: int | None, client_cpus: float) -> None:
    """What the flags alone say is wrong, in the baseline's own words, before Flower, Ray or
    torch is imported (or installed)."""
    if agents < 1:
        fail(f"agents must be at least 1, got {agents}")
    if rounds is not None and rounds < 1:
        fail(f"rounds must be at least 1, got {rounds}")
    if not client_cpus > 0:
        fail(f"client CPUs must be positive, got {client_cpus}")
    folder = Path(app)
    if ":" not in app and not folder.is_dir():
        fail(f"flower app '{app}' is neither a folder nor module:attr of a ClientApp")
    if folder.is_dir() and not (folder / "pyproject.toml").is_file():
        fail(
            f"flower app '{app}' has no pyproject.toml (a Flower app project, as `flwr new` "
            "makes one, or module:attr of a ClientApp)"
        )


def following_total(display: ProgressDisplay) -> Callable[[FleetProgress], None]:
    """``display.update`` that first sets the bar's total to the run's rounds (the app's
    ``num-server-rounds`` is known only once the baseline has loaded the app)."""

    def update(progress: FleetProgress) -> None:
        if progress.rounds_total > 0:
            display.progress.update(display.bar, total=progress.rounds_total)
        display.update(progress)

    return update


def extra_requirements(extra: str = EXTRA) -> list[str]:
    """The requirements of one of airgossip's extras, as its installed metadata lists them."""
    marker = f'extra == "{extra}"'
    return [
        req.split(";")[0].strip()
        for req in importlib.metadata.requires("airgossip") or []
        if req.partition(";")[2].strip() == marker
    ]


def lock_pins(lock: Path, constraints: Path) -> list[str]:
    """pip's arguments that hold an install to the versions ``lock`` pins (none without one).

    The lock's hashes are left out: in a constraints file they would demand a hash of every
    requirement, the extra's own unpinned names too."""
    if not lock.is_file():
        return []
    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*==\S+)", lock.read_text(), re.M)
    constraints.write_text("\n".join(pins) + "\n")
    return ["-c", str(constraints)]


def ensure_simulation_engine() -> None:
    """Install the ``[baseline]`` extra (Flower's simulation engine, Ray: about 220 MB
    installed) on first use, after saying so in one line; a failed install is one line."""
    if importlib.util.find_spec(ENGINE_MODULE) is not None:
        return
    requirements = extra_requirements()
    if not requirements:
        fail(f"the Flower baseline needs Flower's simulation engine (airgossip[{EXTRA}])")
    errors.print(
        f"baseline: installing Flower's simulation engine first (airgossip[{EXTRA}]: "
        f"{' '.join(requirements)}, Ray, about 220 MB)",
        highlight=False, markup=False, soft_wrap=True,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        pins = lock_pins(LOCK, Path(folder) / "constraints.txt")
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", *pins, *requirements],
            capture_output=True, text=True,
        )  # fmt: skip
    importlib.invalidate_caches()
    if result.returncode != 0 or importlib.util.find_spec(ENGINE_MODULE) is None:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        fail(
            f"could not install airgossip[{EXTRA}] ({last}): pip install 'airgossip[{EXTRA}]'",
            code=1,
        )
