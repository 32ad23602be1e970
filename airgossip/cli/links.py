"""``airgossip links``: a wireless scenario's link table at one moment, and its picture."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from airgossip.cli.display import console, fail, say
from airgossip.cli.scenario import flag_overrides, scenario_base

if TYPE_CHECKING:
    from airgossip.scenario.wireless import WirelessSettings


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
    path_loss: Annotated[
        bool,
        typer.Option(
            "--path-loss",
            help="Print and draw the scenario's path loss against distance beside 3GPP TR "
            "38.901's curve instead of its links.",
        ),
    ] = False,
) -> None:
    """Print a wireless scenario's link table at one moment and draw its topology.

    SCENARIO is a preset ({presets}) or a TOML file with a \\[wireless] table.
    """
    from airgossip.cli.early import check_flags, check_scenario

    if at < 0:
        fail(f"--at must be >= 0 seconds, got {at:g}")
    check_scenario(scenario)
    check_flags(flag_overrides(agents=agents, seed=seed))

    from airgossip.emulation.networks.link_report import link_report, plot_links
    from airgossip.emulation.networks.wireless import WirelessNetwork
    from airgossip.scenario.config import ConfigError, load_config

    base = scenario_base(scenario)
    try:
        cfg = load_config(None, flag_overrides(agents=agents, seed=seed), base=base)
        if cfg.wireless is None:
            fail(f"scenario '{scenario}' has no [wireless] table")
        network = WirelessNetwork(cfg)
        network.first_graph()  # the scenario can be built (traces read, nodes placed)
    except ConfigError as err:
        fail(str(err))
    if path_loss:
        _path_loss_table(cfg.wireless, png)
        return
    report = link_report(network, at)
    assert cfg.wireless is not None
    graph = report.graph
    title = (
        f"{cfg.wireless.name} · {cfg.agents} agents · t = {at:g} s (step {report.step}) · "
        f"{graph.radio_links} radio links · {int(graph.adjacency.sum())} gossip links · "
        f"{'strongly connected' if graph.strongly_connected else f'{graph.components} components'}"
    )
    # No vertical rules, no edges and two-line headers: ten columns of full ids and figures fit 80
    # columns, and the table reads the same when piped.
    table = Table(
        title=Text(title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
        collapse_padding=True, show_edge=False,
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


def _path_loss_table(wireless: WirelessSettings, png: Path) -> None:
    """The path loss of a scenario against distance, beside 38.901's base-station curve."""
    import numpy as np

    from airgossip.emulation.channel.curves import TABLE_DISTANCES_M, path_loss_curves

    area = wireless.mobility.area_m
    reach = max(float(np.hypot(area[0], area[1])), 10.0)
    rows = [d for d in TABLE_DISTANCES_M if d <= reach * 2]
    c = path_loss_curves(wireless, np.array(rows))
    mixed = c.model_nlos is not None
    where = f"both ends at {c.height_m:g} m"
    if c.breakpoint_m is not None:
        where += f", breakpoint {c.breakpoint_m:.1f} m"
    ref_head: tuple[str, ...]
    if c.standard_heights_m is None:
        ref, ref_head = "free space", ("free\nspace",)
    else:
        ref = f"38.901 at h_BS {c.standard_heights_m[0]:g} m, h_UT {c.standard_heights_m[1]:g} m"
        ref_head = ("38.901\nLOS", "38.901\nNLOS") if mixed else ("38.901\ndB",)
    title = f"{wireless.name} · path loss {c.model} ({where}) · reference: {ref} · dB"
    table = Table(
        title=Text(title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
        collapse_padding=True,
    )  # fmt: skip
    heads = ["dist\nm", *(("P(LOS)", "model\nLOS", "model\nNLOS") if mixed else ("model\ndB",)),
             *ref_head, "valid"]  # fmt: skip
    for head in heads:
        table.add_column(head, justify="right", no_wrap=True)
    for k, d in enumerate(rows):
        cells = [f"{d:g}"]
        if mixed:
            assert c.los_probability is not None and c.model_nlos is not None
            cells += [f"{c.los_probability[k]:.3f}", f"{c.model_los[k]:.1f}",
                      f"{c.model_nlos[k]:.1f}"]  # fmt: skip
        else:
            cells.append(f"{c.model_los[k]:.1f}")
        cells.append(f"{c.standard_los[k]:.1f}")
        if mixed:
            assert c.standard_nlos is not None
            cells.append(f"{c.standard_nlos[k]:.1f}")
        cells.append("yes" if c.valid[k] else "no")
        table.add_row(*cells)
    console.print(table)
    say("valid: inside 38.901's range for the family (10 m-5 km 2D for UMi/UMa, 1-150 m 3D "
        "for InH); outside it the formulas are extrapolated")  # fmt: skip
    _plot_path_loss(wireless, reach, png, title)
    say(f"path loss picture: {png}")


def _plot_path_loss(wireless: WirelessSettings, reach: float, png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from airgossip.emulation.channel.curves import path_loss_curves

    c = path_loss_curves(wireless, np.geomspace(1.0, max(reach, 10.0), 400))
    fig, ax = plt.subplots(figsize=(8, 5))
    if c.model_nlos is None:
        ax.plot(c.distance_m, c.model_los, label=f"model ({c.model})", color="C0")
        ax.plot(c.distance_m, c.standard_los, "--", label="reference", color="C1")
    else:
        assert c.standard_nlos is not None
        ax.plot(c.distance_m, c.model_los, label="model LOS (device to device)", color="C0")
        ax.plot(c.distance_m, c.model_nlos, label="model NLOS (device to device)", color="C3")
        ax.plot(c.distance_m, c.standard_los, "--", label="38.901 LOS (base station)", color="C0")
        ax.plot(c.distance_m, c.standard_nlos, "--", label="38.901 NLOS (base station)",
                color="C3")  # fmt: skip
    if c.breakpoint_m is not None:
        ax.axvline(c.breakpoint_m, color="grey", lw=0.8, ls=":", label="breakpoint (model)")
    ax.set_xscale("log")
    ax.set_xlabel("2D distance (m)")
    ax.set_ylabel("path loss (dB)")
    ax.set_title(title, fontsize=8)
    ax.grid(True, which="both", lw=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
