"""``airgossip links``: a wireless scenario's link table at one moment, and its picture."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from airgossip.cli.display import console, fail, say
from airgossip.cli.scenario import flag_overrides, scenario_base


def links_command(
    scenario: Annotated[str, typer.Argument(show_default=False)],
    at: Annotated[float, typer.Option("--at", help="Seconds into the scenario.")] = 0.0,
    agents: Annotated[
        int | None, typer.Option(help="Number of agents (default: the scenario's).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed (default: the scenario's).")] = None,
    png: Annotated[Path, typer.Option(help="Where to write the topology picture.")] = Path(
        "links.png"
    ),
    limit: Annotated[int, typer.Option(help="Rows of the table to print (0: all).")] = 40,
) -> None:
    """Print a wireless scenario's link table at one moment and draw its topology.

    SCENARIO is a preset ({presets}) or a TOML file with a \\[wireless] table.
    """
    from airgossip.cli.early import check_flags, check_scenario

    if at < 0:
        fail(f"--at must be >= 0 seconds, got {at:g}")
    check_scenario(scenario)
    check_flags(flag_overrides(agents=agents, seed=seed))

    from emulation.config import ConfigError, load_config
    from emulation.networks.link_report import link_report, plot_links
    from emulation.networks.wireless import WirelessNetwork

    base = scenario_base(scenario)
    try:
        cfg = load_config(None, flag_overrides(agents=agents, seed=seed), base=base)
        if cfg.wireless is None:
            fail(f"scenario '{scenario}' has no [wireless] table")
        network = WirelessNetwork(cfg)
        network.first_graph()  # the scenario can be built (traces read, nodes placed)
    except ConfigError as err:
        fail(str(err))
    report = link_report(network, at)
    assert cfg.wireless is not None
    graph = report.graph
    title = (
        f"{cfg.wireless.name} · {cfg.agents} agents · t = {at:g} s (step {report.step}) · "
        f"{graph.radio_links} radio links · {int(graph.adjacency.sum())} gossip links · "
        f"{'strongly connected' if graph.strongly_connected else f'{graph.components} components'}"
    )
    # No vertical rules and two-line headers: ten columns of full ids and figures fit 80
    # columns, and the table reads the same when piped.
    table = Table(
        title=Text(title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
        collapse_padding=True,
    )  # fmt: skip
    for column in ("from", "to", "dist\nm", "rx\ndBm", "SINR\ndB", "rate\nMb/s",
                   "goodput\nMb/s", "PER", "burst", "gossip"):  # fmt: skip
        left = column in ("from", "to")
        table.add_column(column, justify="left" if left else "right", no_wrap=True)
    shown = report.rows if limit <= 0 else report.rows[:limit]
    for r in shown:
        table.add_row(
            r.sender, r.receiver, f"{r.distance_m:.1f}", f"{r.rx_dbm:.1f}", f"{r.sinr_db:.1f}",
            f"{r.rate_mbps:.1f}", f"{r.goodput_mbps:.1f}", f"{r.per:.2g}",
            "bad" if r.bad else "good", "yes" if r.gossip else "",
        )  # fmt: skip
    console.print(table)
    if len(shown) < len(report.rows):
        say(f"… {len(report.rows) - len(shown)} more links (--limit 0 shows all)")
    plot_links(report, png, title)
    say(f"topology picture: {png}")
