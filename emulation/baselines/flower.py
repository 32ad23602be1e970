"""Flower's centralized run of an app, beside our serverless ones: the baseline.

:func:`run_flower_baseline` runs a Flower app with Flower's own simulation engine (Ray) and
the app's own ServerApp (FedAvg for a quickstart app) on as many nodes as a serverless run has
agents; node ``i`` gets ``partition-id`` ``i``, as agent ``i`` does, so both see the same data
split. It writes ``results.json`` in our schema (:class:`~airgossip.scenario.results.RunResults`):
per round the accuracy the ClientApps report on the global model (mean, min, max over the nodes that
evaluated), the bytes Flower moved so far (messages to and from the server, in Flower's serialized
form) and the wall time since the ServerApp started.

Flower's side effects stay inside the run's folder: the engine runs in a process group of
its own (``airgossip.emulation.baselines.flower_simulation``) that is ended, with Ray's processes,
whatever happens; telemetry, update checks and Ray's usage stats are off; ``FLWR_HOME`` is
``OUT/flower-home``; the app's dependencies are not installed (they must be importable
already) and no SuperLink is started.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from airgossip.common.security.private_files import open_private, private_folder
from airgossip.emulation.baselines.job import FlowerJob, FlowerRound, RunConfigValue
from airgossip.emulation.fleets.base import FleetProgress
from airgossip.emulation.fleets.processes import JsonLinesTail
from airgossip.node.folder import refuse_used_out_dir
from airgossip.scenario.config import ConfigError
from airgossip.scenario.results import FinalFigures, RoundFigures, RunResults, plot_results

if TYPE_CHECKING:  # Flower is imported when a baseline runs
    from airgossip.edge.tasks.flower.app import FlowerApp

_Row = TypeVar("_Row", bound=RoundFigures)

#: The key of a Flower app's run config that sets how many rounds its ServerApp runs.
NUM_ROUNDS_KEY = "num-server-rounds"
#: What a baseline leaves in its output folder besides results.json and logs/.
ROUNDS_FILE = "rounds.jsonl"


class BaselineError(RuntimeError):
    """A baseline that did not run to the end; the message says why, in one line."""


@dataclass(frozen=True)
class FlowerBaseline:
    """One Flower baseline run.

    Attributes
    ----------
    app:
        The Flower app's project folder (it needs its ServerApp).
    agents:
        Simulated nodes (``num-supernodes``): the fleet size it is compared with.
    rounds:
        Server rounds (sets the app's ``num-server-rounds``; default: the app's).
    run_config:
        Overrides of the app's run config, as ``flwr run --run-config`` gives them.
    accuracy_metric, loss_metric:
        The app's metric names (default: ``accuracy``/``eval_acc``, ``loss``/``eval_loss``).
    seed:
        Seeds the global RNGs before the ServerApp starts, so it builds the same initial
        model as a serverless run of the same seed.
    client_cpus:
        CPUs Ray reserves per ClientApp (how many run at once).
    timeout_s:
        Longest the whole run may take.
    """

    app: str
    agents: int = 8
    rounds: int | None = None
    run_config: Mapping[str, RunConfigValue] = field(default_factory=dict)
    accuracy_metric: str | None = None
    loss_metric: str | None = None
    seed: int = 0
    client_cpus: float = 1.0
    timeout_s: float = 3600.0


def _check(baseline: FlowerBaseline) -> tuple[FlowerApp, dict[str, RunConfigValue]]:
    """The app and the run config overrides, or :class:`ConfigError`."""
    from airgossip.edge.tasks.flower import FlowerAppError, load_flower_app

    if baseline.agents < 1:
        raise ConfigError(f"agents must be at least 1, got {baseline.agents}")
    if baseline.rounds is not None and baseline.rounds < 1:
        raise ConfigError(f"rounds must be at least 1, got {baseline.rounds}")
    if not baseline.client_cpus > 0:
        raise ConfigError(f"client CPUs must be positive, got {baseline.client_cpus}")
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "the Flower baseline needs Flower's simulation engine (Ray): "
            "pip install 'airgossip[baseline]' (or 'flwr[simulation]')"
        )
    overrides = dict(baseline.run_config)
    try:
        app = load_flower_app(baseline.app, overrides)
        if app.project_dir is None or app.server_ref is None:
            raise ConfigError(
                f"flower app '{baseline.app}': the baseline runs the app's own ServerApp; "
                "give the app's project folder (its pyproject.toml names the ServerApp)"
            )
        if baseline.rounds is not None:
            if NUM_ROUNDS_KEY not in app.run_config:
                raise ConfigError(
                    f"flower app '{baseline.app}' has no '{NUM_ROUNDS_KEY}' in its run "
                    "config: its ServerApp decides the rounds, drop --rounds"
                )
            overrides[NUM_ROUNDS_KEY] = baseline.rounds
            app = load_flower_app(baseline.app, overrides)
    except FlowerAppError as err:
        raise ConfigError(str(err)) from None
    return app, overrides


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _error_line(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line.strip() for line in lines if line.startswith("error: ")]
    if errors:
        return errors[-1].removeprefix("error: ")
    return " | ".join(line.strip() for line in lines[-3:] if line.strip())


def _end_group(process: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """End the engine's process group (Ray's raylet, GCS and workers with it)."""
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            process.poll()
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def _figures(row: FlowerRound, figures: type[_Row], **fixed: object) -> _Row:
    """A round's figures as our results have them (``fixed``: more fields, ``complete``);
    figures the round does not have are left unset (and out of results.json)."""
    accuracies, losses = row.accuracies, row.losses
    out = figures.model_validate({
        **fixed,
        "round": row.round,
        "wall_s": round(row.wall_s, 4),
        "bytes_sent": row.bytes_sent,
        "messages_sent": row.messages_sent,
        "messages_dropped": row.failed,
        "agents_reporting": max(len(accuracies), len(losses)),
    })  # fmt: skip
    if accuracies:
        out.mean_accuracy = sum(accuracies) / len(accuracies)
        out.min_accuracy = min(accuracies)
        out.max_accuracy = max(accuracies)
    if losses:
        out.mean_loss = sum(losses) / len(losses)
    return out


def _progress(agents: int, rounds: int, rows: list[FlowerRound]) -> FleetProgress:
    if not rows:
        return FleetProgress(agents, rounds)
    last = _figures(rows[-1], RoundFigures)
    return FleetProgress(
        agents=agents,
        rounds_total=rounds,
        registered=agents,
        slowest_round=last.round,
        fastest_round=last.round,
        mean_accuracy=last.mean_accuracy,
        messages_sent=last.messages_sent,
        messages_dropped=last.messages_dropped,
    )


def run_flower_baseline(
    baseline: FlowerBaseline,
    out_dir: Path,
    *,
    on_progress: Callable[[FleetProgress], None] | None = None,
) -> RunResults:
    """Run ``baseline`` with Flower's simulation engine; write ``results.json`` (and
    ``results.png``) into ``out_dir`` and return the results.

    Raises
    ------
    ConfigError
        A bad setting or an app the baseline cannot run (no ServerApp), before anything
        starts.
    BaselineError
        The run failed (the app raised, Ray could not start...): one line, and the log's
        path.
    KeyboardInterrupt
        After the engine is stopped and the rounds so far written, ``"interrupted"``.
    """
    app, overrides = _check(baseline)
    refuse_used_out_dir(out_dir)
    rounds_total = int(app.run_config.get(NUM_ROUNDS_KEY, 0))
    logs = out_dir / "logs"
    private_folder(out_dir)
    private_folder(logs)
    out_dir = out_dir.resolve()
    # Ray's session folder holds Unix sockets, whose paths must stay short: not the run's.
    ray_dir = tempfile.mkdtemp(prefix="ag-ray-")
    job = FlowerJob(
        app=str(app.project_dir), run_config=overrides, agents=baseline.agents,
        seed=baseline.seed, client_cpus=baseline.client_cpus,
        accuracy_metric=baseline.accuracy_metric, loss_metric=baseline.loss_metric,
        ray_dir=ray_dir, parent_pid=os.getpid(),
    )  # fmt: skip
    job_path = out_dir / "baseline.json"
    job.write(job_path)
    root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_HOME": str(out_dir / "flower-home"),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
    }
    log_path = logs / "flower.log"
    started = time.monotonic()
    tail = JsonLinesTail(out_dir / ROUNDS_FILE)
    rows: list[FlowerRound] = []
    interrupted = False
    with open_private(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "airgossip.emulation.baselines.flower_simulation",
                str(job_path),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=out_dir,  # files a ServerApp writes (a saved model, say) stay in the run
            start_new_session=True,
        )
    if on_progress is not None:  # the rounds to come, before the first one ends
        on_progress(_progress(baseline.agents, rounds_total, rows))
    try:
        while process.poll() is None:
            if time.monotonic() - started > baseline.timeout_s:
                raise BaselineError(
                    f"Flower baseline still running after {baseline.timeout_s:.0f} s; "
                    f"stopped (log: {log_path})"
                )
            fresh = [FlowerRound.model_validate(row) for row in tail.read()]
            rows += fresh
            if fresh and on_progress is not None:
                on_progress(_progress(baseline.agents, rounds_total, rows))
            time.sleep(0.2)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        _end_group(process)
        shutil.rmtree(ray_dir, ignore_errors=True)
    rows += [FlowerRound.model_validate(row) for row in tail.read()]
    if process.returncode != 0 and not interrupted:
        raise BaselineError(
            f"Flower baseline failed: {_error_line(log_path) or 'no output'} (log: {log_path})"
        )
    figures = [_figures(row, RoundFigures) for row in rows]
    if rows:
        final = _figures(rows[-1], FinalFigures, complete=rows[-1].round >= rounds_total)
    else:
        final = FinalFigures(round=0, complete=False)
    results = RunResults(
        config={
            "baseline": "flower",
            "task": {"name": "flower", "app": str(app.project_dir)},
            "server_app": app.server_ref,
            "client_app": app.client_ref,
            "algorithm": f"Flower ServerApp {app.server_ref}",
            "mode": "flower-simulation",
            "agents": baseline.agents,
            "rounds": rounds_total,
            "run_config": dict(app.run_config),
            "seed": baseline.seed,
            "client_cpus": baseline.client_cpus,
        },
        rounds=figures,
        final=final,
        total_wall_s=round(time.monotonic() - started, 3),
        interrupted=interrupted,
        versions={
            "flwr": _version("flwr"),
            "ray": _version("ray"),
            "torch": _version("torch"),
            "python": sys.version.split()[0],
        },
    )
    results.write(out_dir / "results.json")
    if figures:
        plot_results(
            out_dir / "results.png",
            results,
            f"Flower baseline · {baseline.agents} nodes · {app.server_ref}",
        )
    if interrupted:
        raise KeyboardInterrupt
    return results
