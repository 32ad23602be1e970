"""``airgossip compose``: a compose file for a fleet of any size and scenario."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from airgossip.cli.display import console, fail
from airgossip.cli.scenario import flag_overrides, scenario_base


def compose(
    agents: Annotated[int, typer.Option(help="Number of agents.")] = 8,
    scenario: Annotated[
        str | None,
        typer.Option(
            help="Wireless scenario: a preset ({presets}) or a TOML file; --config and flags "
            "override it (default: static links)."
        ),
    ] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="TOML scenario file; flags override it.")
    ] = None,
    topology: Annotated[
        str | None,
        typer.Option(help="{topologies} (default: from config, else exponential)."),
    ] = None,
    task: Annotated[
        str | None,
        typer.Option(
            help="{app_free_tasks}, or module:callable importable in the image (default: from "
            "config, else digits)."
        ),
    ] = None,
    algorithm: Annotated[
        str | None,
        typer.Option(help="{algorithms} (default: from config, else push-sum)."),
    ] = None,
    rounds: Annotated[int | None, typer.Option(help="Rounds per agent.")] = None,
    loss: Annotated[
        float | None, typer.Option(help="Loss probability on every directed link (static).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of every random draw.")] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Folder to write into (default: compose-<scenario>-<agents>)."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Overwrite files already there.")] = False,
) -> None:
    """Write a compose file (coordinator, agents, Prometheus, Grafana) and its scenario for a
    fleet of any size: `docker-compose -f OUT/docker-compose.yml up -d` runs it."""
    from airgossip.cli.early import check_flags, check_scenario

    if not 1 <= agents <= 250:
        fail(f"--agents must be within 1..250 (one container each), got {agents}")
    overrides = flag_overrides(
        agents=agents, topology=topology, task=task, algorithm=algorithm, rounds=rounds,
        loss=loss, seed=seed,
    )  # fmt: skip
    check_flags(overrides, config)  # what the flags alone say is wrong, before torch
    check_scenario(scenario)

    from airgossip.compose import compose_document, compose_yaml, repository_root, trace_files
    from airgossip.emulation.fleets import preflight
    from airgossip.scenario.config import ConfigError, load_config, scenario_toml

    repository = repository_root()
    if repository is None:
        fail(
            "airgossip compose needs the repository's checkout (the Dockerfile and deploy/ "
            "with the Prometheus and Grafana files): run it from an install made with "
            "`pip install -e .` there"
        )
    try:
        base = scenario_base(scenario) if scenario is not None else None
        cfg = load_config(config, overrides, base=base)
        preflight(cfg.model_copy(update={"mode": "process"}))  # the graph, algorithm, task
    except ConfigError as err:
        fail(str(err))
    name = cfg.wireless.name if cfg.wireless is not None else "static"
    folder = out or Path(f"compose-{name}-{agents}")
    compose_path, scenario_path = folder / "docker-compose.yml", folder / "scenario.toml"
    existing = [p for p in (compose_path, scenario_path) if p.exists()]
    if existing and not force:
        fail(f"{existing[0]} exists; choose another --out or pass --force to overwrite")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        relative = Path(os.path.relpath(repository, folder.resolve())).as_posix()
        document = compose_document(
            agents=agents, scenario="./scenario.toml", repository=relative,
            traces=[t.resolve() for t in trace_files(cfg)],
        )  # fmt: skip
        header = (
            f"airgossip: {agents} agents, {name}; a coordinator, Prometheus and Grafana.\n"
            f"Written by `airgossip compose`; run it with (images: deploy/docker/build)\n"
            f"  docker-compose -f {compose_path} up -d\n"
            "(`down -v` removes what a failed `up` made.) "
            "Grafana (profile grafana, its image from a registry): add --profile grafana,\n"
            "then http://127.0.0.1:3000; docs/deployment.md has the details."
        )
        scenario_path.write_text(
            "# Written by `airgossip compose`: the settings that differ from the defaults.\n"
            + scenario_toml(cfg.model_copy(update={"mode": "process", "out": None}))
        )
        compose_path.write_text(compose_yaml(document, header))
    except OSError as err:
        fail(f"cannot write into {folder}: {err.strerror or err}")
    console.print(
        f"wrote {compose_path} and {scenario_path}: {agents} agents, {name}\n"
        f"  docker-compose -f {compose_path} up -d     "
        "# the images first: deploy/docker/build (no registry) or docker-compose -f ... build",
        highlight=False,
        soft_wrap=True,
    )
