"""``airgossip links``: the link table of a scenario at one moment, and a picture of it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from airgossip.common.identity import agent_ids
from airgossip.common.security.private_files import open_private
from airgossip.common.topology import adjacency_edges
from airgossip.emulation.channel.state import FIGURES, AnyLinkState
from airgossip.emulation.networks.gossip_graph import GraphEpoch
from airgossip.emulation.networks.wireless import WirelessNetwork


@dataclass(frozen=True)
class LinkRow:
    sender: str
    receiver: str
    distance_m: float
    rx_dbm: float
    sinr_db: float
    rate_mbps: float
    goodput_mbps: float
    per: float
    bad: bool
    gossip: bool


@dataclass(frozen=True)
class LinkReport:
    time_s: float
    step: int
    state: AnyLinkState
    graph: GraphEpoch
    rows: list[LinkRow]


def link_report(network: WirelessNetwork, at_s: float) -> LinkReport:
    """Every existing link of a wireless network at ``at_s`` seconds, strongest first."""
    ids = agent_ids(network.config.agents)
    run = network.runtime(ids, lambda: at_s).run
    state = run.model.at(at_s)
    graph = run.topology.graph(at_s)
    src, dst = state.link_pairs()
    values = {name: state.link_values(name) for name in FIGURES}
    order = np.lexsort((-values["rx_dbm"], src))
    rows = [
        LinkRow(
            ids[src[k]],
            ids[dst[k]],
            float(values["distance_m"][k]),
            float(values["rx_dbm"][k]),
            float(values["sinr_db"][k]),
            float(values["rate_bps"][k]) / 1e6,
            float(values["goodput_bps"][k]) / 1e6,
            float(values["per"][k]),
            bool(values["bad"][k]),
            bool(graph.adjacency[src[k], dst[k]]),
        )
        for k in order
    ]
    return LinkReport(at_s, state.step, state, graph, rows)


def plot_links(report: LinkReport, path: Path, title: str) -> None:
    """PNG of node positions, radio links (grey) and gossip links (coloured by goodput)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import cm, colors

    state = report.state
    pos = state.positions
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    src, dst = state.link_pairs()
    radio_only = ~report.graph.adjacency[src, dst]
    for i, j in zip(src[radio_only], dst[radio_only], strict=True):
        ax.plot(*zip(pos[i], pos[j], strict=True), color="0.85", lw=0.5, zorder=1)
    gi, gj = adjacency_edges(report.graph.adjacency)
    figures = [state.figures(state.link(int(i), int(j))) for i, j in zip(gi, gj, strict=True)]
    goodput = np.array([f[3] for f in figures]) / 1e6
    norm = colors.Normalize(vmin=0.0, vmax=max(float(goodput.max(initial=0.0)), 1e-3))
    cmap = matplotlib.colormaps["viridis"]
    for i, j, g, f in zip(gi, gj, goodput, figures, strict=True):
        style = "--" if f[5] else "-"
        ax.annotate(
            "", xy=pos[j], xytext=pos[i],
            arrowprops={"arrowstyle": "-|>", "color": cmap(norm(g)), "lw": 1.2, "ls": style,
                        "shrinkA": 4, "shrinkB": 4},
            zorder=2,
        )  # fmt: skip
    ax.scatter(pos[:, 0], pos[:, 1], s=40, c="black", zorder=3)
    if len(pos) <= 64:
        for k, (x, y) in enumerate(pos):
            ax.annotate(str(k), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    fig.colorbar(
        cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="gossip link goodput (Mbit/s)"
    )
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_title(title.replace(" · t =", "\nt =", 1), fontsize=10)
    fig.tight_layout()
    with open_private(path, "wb") as handle:
        fig.savefig(handle, dpi=110, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
