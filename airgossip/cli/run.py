"""``airgossip run``: a whole fleet on this machine, to results.json and a plot."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from airgossip.cli.display import (
    ProgressDisplay,
    console,
    fail,
    run_banner,
    say,
    summary_table,
)
from airgossip.cli.flower import contain_flower, flower_overrides, with_flower_rounds
from airgossip.cli.scenario import default_out, flag_overrides, scenario_base
from airgossip.scenario.modes.ray import RaySettings, ray_address_problem

if TYPE_CHECKING:
    from airgossip.scenario.config import RunConfig


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _with_ray_address(cfg: RunConfig, flag: str | None) -> RunConfig:
    """``cfg`` with the Ray cluster to join resolved: ``--ray-address``, else the scenario's
    ``[ray] address``, else ``RAY_ADDRESS`` (Ray's own convention), else none (a local Ray)."""
    if flag is not None and cfg.mode != "ray":
        fail(f"--ray-address needs --mode ray, not {cfg.mode}")
    address = flag
    settings = cfg.mode_settings(RaySettings)
    if address is None and cfg.mode == "ray" and settings.address is None:
        from_env = os.environ.get("RAY_ADDRESS", "").strip()
        if from_env:
            problem = ray_address_problem(from_env)
            if problem is not None:
                fail(f"RAY_ADDRESS: {problem}")
            address = from_env
    if address is None:
        return cfg
    return cfg.with_mode_settings(settings.model_copy(update={"address": address}))


def _warm_agents(cfg: RunConfig, out_dir: Path) -> None:
    """Fork the agents' fork server from this process now where the run is a process fleet
    on this machine: the settings' check has imported torch and nothing has started a
    thread, so the server and every agent share this process's imports instead of holding a
    second copy, and the run's preflight goes on beside the server's remaining imports
    (:mod:`airgossip.emulation.fleets.agent_server`). The preflight may still refuse the
    run (the server stops then). Not after the preflight: loading a task may compute (a
    Flower app's initial parameters, say) and start native thread pools (a Flower app's
    preflight leaves two more threads) that ``threading`` does not see and whose locks a
    forked child would find held: its agents hung before registering."""
    if cfg.mode != "process":
        return
    from airgossip.emulation.fleets.agent_server import warm_fork_server

    warm_fork_server(label=str(out_dir), wireless=cfg.wireless is not None, here=True)


def run(
    agents: Annotated[int | None, typer.Option(help="Number of agents (default: 8).")] = None,
    topology: Annotated[
        str | None,
        typer.Option(help="{topologies} (default: exponential)."),
    ] = None,
    task: Annotated[
        str | None,
        typer.Option(
            help="{tasks} (flower: with --flower-app), or module:callable (default: digits)."
        ),
    ] = None,
    algorithm: Annotated[
        str | None,
        typer.Option(help="{algorithms} (default: push-sum)."),
    ] = None,
    compression: Annotated[
        str | None,
        typer.Option(
            help="Codec of every message: none (lossless in the gossip precision), {codecs} "
            "(default: none)."
        ),
    ] = None,
    rounds: Annotated[int | None, typer.Option(help="Rounds per agent (default: 40).")] = None,
    loss: Annotated[
        float | None,
        typer.Option(help="Message loss probability on every directed link (default: 0.1)."),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of every random draw (default: 0).")
    ] = None,
    pace: Annotated[
        str | None,
        typer.Option(
            help="rounds: each round waits (at most wait_timeout_s) for in-neighbours within "
            "staleness rounds; async: for its own sends only, each agent at its device's "
            "pace (default: rounds)."
        ),
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(
            help="How agents run: {modes} (default: process; containers, ray: docs/deployment.md)."
        ),
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda (default: auto).")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Output folder (default: runs/<timestamp>).")
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML scenario file; flags override it.")
    ] = None,
    coordinator_port: Annotated[
        int, typer.Option(help="Port of the embedded coordinator (0: any free port).")
    ] = 0,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve the embedded coordinator's /metrics, /sd (Prometheus service "
            "discovery) and /fleet on this port (default: off)."
        ),
    ] = None,
    scenario: Annotated[
        str | None,
        typer.Option(
            help="Wireless scenario: a preset ({presets}) or a TOML file; --config and flags "
            "override it."
        ),
    ] = None,
    record: Annotated[
        bool, typer.Option("--record", help="Write replay logs of link states (wireless).")
    ] = False,
    flower_app: Annotated[
        str | None,
        typer.Option(
            help="Run an unchanged Flower app as the task: its project folder (pyproject.toml) "
            "or module:attr of its ClientApp; its num-server-rounds sets --rounds."
        ),
    ] = None,
    server_app: Annotated[
        str | None,
        typer.Option(
            help="Flower app: module:attr of the ServerApp whose first message is the initial "
            "model (default: the project's; a bare ClientApp is asked itself)."
        ),
    ] = None,
    run_config: Annotated[
        str | None,
        typer.Option(help="Flower app: run config overrides, as flwr run takes them ('k=v ...')."),
    ] = None,
    accuracy_metric: Annotated[
        str | None,
        typer.Option(help="Flower app: its accuracy metric (default: accuracy, else eval_acc)."),
    ] = None,
    loss_metric: Annotated[
        str | None,
        typer.Option(help="Flower app: its loss metric (default: loss, else eval_loss)."),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Agent processes talk plaintext gRPC (default: mutual TLS with a throwaway "
            "certificate authority in the run folder).",
        ),
    ] = False,
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="Mode ray: the cluster to join (auto, host:port, ray://host:port, local; "
            "default: the scenario's ray address, else $RAY_ADDRESS, else a local Ray)."
        ),
    ] = None,
) -> None:
    """Run a fleet of agents locally and write results.json and a plot."""
    overrides = flag_overrides(
        agents=agents, topology=topology, task=task, algorithm=algorithm, rounds=rounds,
        loss=loss, seed=seed, mode=mode, device=device, compression=compression, pace=pace,
    )  # fmt: skip
    # Everything the flags alone can say is wrong is said before torch is imported.
    from airgossip.cli.early import (
        check_flags,
        check_port,
        check_run,
        check_scenario,
        check_scenario_file,
    )

    check_scenario(scenario)
    file_settings = check_scenario_file(config) if config is not None else {}
    base = scenario_base(scenario) if scenario is not None else None
    named_out = file_settings.get("out")
    out_dir = out or (Path(named_out) if isinstance(named_out, str) else None) or default_out()
    check_port("--coordinator-port", coordinator_port)
    check_port("--metrics-port", metrics_port, lowest=1)
    if flower_app is not None and task is not None:
        fail("give either --task or --flower-app, not both")
    check_flags(overrides, config)
    if ray_address is not None:
        problem = ray_address_problem(ray_address)
        if problem is not None:
            fail(f"--ray-address: {problem}")
    check_run(overrides, config, wireless=scenario is not None, app=flower_app is not None)

    from airgossip.scenario.config import ConfigError, load_config

    flower = flower_overrides(
        flower_app, run_config, accuracy_metric, loss_metric, server_app=server_app
    )
    if flower:  # no --task with them (refused above)
        overrides["task"] = flower
    try:
        # A setting wrong on its own is refused here, before the fleets (and torch) load.
        cfg = with_flower_rounds(load_config(config, overrides, base=base), flower)
    except ConfigError as err:
        fail(str(err))
    cfg = _with_ray_address(cfg, ray_address)
    if record:
        if cfg.wireless is None:
            fail("--record needs a wireless scenario (--scenario NAME|FILE)")
        cfg = cfg.model_copy(update={"wireless": cfg.wireless.model_copy(update={"record": True})})

    from airgossip.emulation.fleets import FLEETS, FleetError, preflight, run_fleet
    from airgossip.node.folder import refuse_used_out_dir

    _warm_agents(cfg, out_dir)
    try:
        plan = preflight(cfg)
        refuse_used_out_dir(out_dir)
    except ConfigError as err:
        fail(str(err))
    if cfg.task.name == "flower":
        contain_flower(out_dir)
    if metrics_port is not None and not plan.fleet.serves_metrics:
        serving = ", ".join(m for m, f in FLEETS.items() if f.serves_metrics)
        fail(f"--metrics-port needs a mode whose agents serve metrics ({serving}), not {cfg.mode}")
    if plan.fleet.in_process:
        import torch

        torch.set_num_threads(1)

    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    links = plan.network.describe()
    say(run_banner(cfg, links, out_dir))
    try:
        with ProgressDisplay(cfg.rounds, gossip_only=cfg.task.name == "consensus") as display:
            results = run_fleet(
                cfg, out_dir, plan=plan, on_progress=display.update, on_notice=display.notice,
                coordinator_listen=f"127.0.0.1:{coordinator_port}",
                coordinator_metrics_listen=(
                    f"127.0.0.1:{metrics_port}" if metrics_port is not None else None
                ),
                insecure=insecure,
            )  # fmt: skip
    except ConfigError as err:
        fail(str(err))
    except FleetError as err:
        fail(str(err), code=1)
    except OSError as err:
        if coordinator_port and "listen" in str(err):
            fail(f"{err}; pick another --coordinator-port or 0 for any free port")
        fail(str(err), code=1)
    except KeyboardInterrupt:
        say(f"interrupted: agents stopped; partial results in {out_dir}", err=True)
        raise typer.Exit(130) from None
    if results.kernel is not None:  # message losses, and the kernel's packet drops apart
        links = f"{links}; {results.kernel.describe()}"
    console.print(summary_table(results, out_dir, links))
