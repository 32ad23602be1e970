"""airgossip's Grafana dashboards as code (grafana-foundation-sdk, a dev dependency).

    python deploy/grafana/dashboards.py          # rewrites deploy/grafana/dashboards/*.json

Three dashboards, every panel on the Prometheus datasource the compose stack provisions
(uid ``airgossip-prometheus``), each with the variables ``agent`` and ``peer`` (the other
end of a directed link):

* fleet overview: accuracy per agent, consensus distance, rounds/s, agents alive, graph
  strongly connected, mixing |lambda2|, privacy spent (epsilon) per agent;
* network: bytes/s and drop rate per directed link (messages dropped by an in-agent shaper,
  packets dropped by the kernel), SINR and rate per link, links in range;
* agent detail: push latency (quantiles and histogram), refused messages by reason, local
  step time, and what each in-neighbour does to the agent (relative increment, refusals and
  clips) beside the insider alerts firing.

The metric names are those of ``edge/observability/metrics.py`` (agents) and
``coordinator/observability.py`` (the coordinator). ``tests/deploy/test_dashboards.py``
checks that the JSON files are what this script writes, and the compose test runs every
panel's queries against a Prometheus scraping a running fleet.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, stat, timeseries
from grafana_foundation_sdk.builders.common import ReduceDataOptions, VizLegendOptions
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    ValueMap,
    ValueMappingResult,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

#: The datasource the stack provisions (deploy/grafana/provisioning/datasources).
DATASOURCE = DataSourceRef(type_val="prometheus", uid="airgossip-prometheus")
OUT = Path(__file__).parent / "dashboards"
#: Label filters every panel takes from the variables.
AGENT = 'agent=~"$agent"'
LINK = 'agent=~"$agent", peer=~"$peer"'
RATE = "$__rate_interval"

Panel = db.Panel | timeseries.Panel | stat.Panel | heatmap.Panel
#: A 0/1 gauge shown as no/yes.
YES_NO = ValueMap(
    {
        "0": ValueMappingResult(text="no", color="red"),
        "1": ValueMappingResult(text="yes", color="green"),
    }
)


def query(expr: str, legend: str = "", ref: str = "A") -> Dataquery:
    return (
        Dataquery().expr(expr).legend_format(legend or "__auto").ref_id(ref).datasource(DATASOURCE)
    )


def series(title: str, description: str, unit: str, *queries: Dataquery) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .legend(
            VizLegendOptions()
            .display_mode(LegendDisplayMode.TABLE)
            .placement(LegendPlacement.RIGHT)
            .show_legend(True)
        )
    )
    for q in queries:
        panel = panel.with_target(q)
    return panel


def big_number(title: str, description: str, *queries: Dataquery) -> stat.Panel:
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]))
    )
    for q in queries:
        panel = panel.with_target(q)
    return panel


def variables() -> list[db.QueryVariable]:
    """``agent`` (every agent the fleet has) and ``peer`` (the other end of its links)."""

    def variable(name: str, label: str, values: str) -> db.QueryVariable:
        return (
            db.QueryVariable(name)
            .label(label)
            .datasource(DATASOURCE)
            .query(values)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.NATURAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )

    return [
        variable("agent", "agent", "label_values(airgossip_agent_info, agent)"),
        variable(
            "peer",
            "link: other end",
            'label_values(airgossip_agent_messages_sent_total{agent=~"$agent"}, peer)',
        ),
    ]


def dashboard(uid: str, title: str, description: str, rows: list[list[Panel]]) -> db.Dashboard:
    """A dashboard of ``rows`` (panels of a row share the 24 columns, 4 or 8 high)."""
    builder = (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["airgossip"])
        .editable()
        .refresh("10s")
        .time("now-15m", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .variables(variables())  # type: ignore[arg-type]
    )
    for row in rows:
        width = 24 // len(row)
        height = 4 if all(isinstance(p, stat.Panel) for p in row) else 8
        for panel in row:
            builder = builder.with_panel(panel.span(width).height(height))
    return builder


def fleet() -> db.Dashboard:
    return dashboard(
        "airgossip-fleet",
        "airgossip · fleet overview",
        "How the fleet learns: accuracy, consensus, pace, membership and the graph.",
        [
            [
                big_number(
                    "Agents alive",
                    "Agents heartbeating, of those the first graph waited for.",
                    query("airgossip_fleet_agents_alive", "alive"),
                    query("airgossip_fleet_agents_expected", "expected", "B"),
                ),
                big_number(
                    "Graph strongly connected",
                    "1 when every live agent's updates can reach every other live agent.",
                    query("airgossip_fleet_graph_strongly_connected", "connected"),
                ).mappings([YES_NO]),
                big_number(
                    "Mixing |λ2|",
                    "Second-largest |eigenvalue| of the coordinator's mixing matrix (smaller "
                    "mixes faster).",
                    query("airgossip_fleet_mixing_second_largest_eigenvalue", "lambda2"),
                ).decimals(3),
                big_number(
                    "Rounds/s (fleet)",
                    "Rounds completed per second by all agents together.",
                    query(f"sum(rate(airgossip_agent_rounds_total[{RATE}]))", "rounds/s"),
                )
                .unit("short")
                .decimals(1),
            ],
            [
                series(
                    "Test accuracy per agent",
                    "Accuracy of each agent's estimate on the test set.",
                    "percentunit",
                    query(f"airgossip_agent_accuracy_ratio{{{AGENT}}}", "{{agent}}"),
                )
                .min(0)
                .max(1),
                series(
                    "Consensus distance per agent",
                    "How far the agent's last mix moved its estimate, relative to its size "
                    "(0 at consensus).",
                    "percentunit",
                    query(f"airgossip_agent_disagreement_ratio{{{AGENT}}}", "{{agent}}"),
                ).min(0),
            ],
            [
                series(
                    "Rounds/s per agent",
                    "Rounds each agent completes per second.",
                    "short",
                    query(f"rate(airgossip_agent_rounds_total{{{AGENT}}}[{RATE}])", "{{agent}}"),
                ).min(0),
                series(
                    "Agents by state",
                    "Registered agents alive, dead (silent past the heartbeat timeout) or "
                    "left; the graph's epoch bumps at every repair.",
                    "short",
                    query("airgossip_fleet_agents", "{{state}}"),
                    query("airgossip_fleet_topology_epoch", "graph epoch", "B"),
                ).min(0),
            ],
            [
                series(
                    "Privacy spent per agent (ε)",
                    "Epsilon each agent has spent on its training data, at the run's delta "
                    "([privacy]; network DP: towards the agent that learns most of it). +Inf: "
                    "no privacy mechanism, no guarantee.",
                    "short",
                    query(f"airgossip_agent_privacy_epsilon{{{AGENT}}}", "{{agent}}"),
                    query(
                        f"airgossip_agent_privacy_budget_exhausted{{{AGENT}}}",
                        "{{agent}} budget reached",
                        "B",
                    ),
                ).min(0),
            ],
            [
                series(
                    "Energy spent per agent",
                    "Joules each agent has spent computing and on the radio, at its device "
                    "class's power ([[device_classes]], docs/devices.md); agents whose class "
                    "draws none are not drawn.",
                    "joule",
                    query(
                        f"sum by (agent) (airgossip_agent_energy_joules{{{AGENT}}})", "{{agent}}"
                    ),
                ).min(0),
                series(
                    "Battery left per agent",
                    "Joules left in each agent's battery; at 0 it has left the fleet.",
                    "joule",
                    query(f"airgossip_agent_battery_left_joules{{{AGENT}}}", "{{agent}}"),
                ).min(0),
            ],
        ],
    )


def network() -> db.Dashboard:
    sent = f"sum by (agent, peer) (rate(airgossip_agent_messages_sent_total{{{LINK}}}[{RATE}]))"
    dropped = (
        f"sum by (agent, peer) (rate(airgossip_agent_messages_dropped_total{{{LINK}}}[{RATE}]))"
    )
    packets = f"sum by (agent, peer) (rate(airgossip_link_arrived_packets_total{{{LINK}}}[{RATE}]))"
    packets_dropped = (
        f"sum by (agent, peer) (rate(airgossip_link_dropped_packets_total{{{LINK}}}[{RATE}]))"
    )
    return dashboard(
        "airgossip-network",
        "airgossip · network",
        "The directed links: traffic, losses and, for wireless scenarios, the radio.",
        [
            [
                series(
                    "Bytes/s per directed link",
                    "Bytes each agent pushes to each out-neighbour (on the wire, lost "
                    "messages included).",
                    "Bps",
                    query(
                        "sum by (agent, peer) "
                        f"(rate(airgossip_agent_sent_bytes_total{{{LINK}}}[{RATE}]))",
                        "{{agent}} → {{peer}}",
                    ),
                ).min(0),
                series(
                    "Links in range",
                    "Emulated radio links that exist now, per agent and in all (wireless "
                    "scenarios).",
                    "short",
                    query(f"sum by (agent) (airgossip_link_in_range{{{AGENT}}})", "{{agent}}"),
                    query("sum(airgossip_link_in_range)", "all", "B"),
                ).min(0),
            ],
            [
                series(
                    "Message drop rate per directed link",
                    "Share of messages lost on each link by an in-agent link shaper (0 where "
                    "the kernel shapes the links: TCP then carries every message).",
                    "percentunit",
                    # Links with no drop yet have no dropped series: count them as 0.
                    query(f"({dropped} or {sent} * 0) / {sent}", "{{agent}} → {{peer}}"),
                ).min(0),
                series(
                    "Packet drop rate per directed link (kernel)",
                    "Share of packets from peer dropped by the emulated link at the "
                    "receiver's interface (links shaped by the kernel in containers).",
                    "percentunit",
                    query(f"{packets_dropped} / {packets}", "{{peer}} → {{agent}}"),
                ).min(0),
            ],
            [
                series(
                    "SINR per link",
                    "Emulated signal to interference and noise ratio of each out-link.",
                    "dB",
                    query(f"airgossip_link_sinr_decibels{{{LINK}}}", "{{agent}} → {{peer}}"),
                ),
                series(
                    "Rate per link",
                    "Emulated physical rate of each out-link (bytes/s: its bit rate / 8).",
                    "Bps",
                    query(
                        f"airgossip_link_rate_bytes_per_second{{{LINK}}}", "{{agent}} → {{peer}}"
                    ),
                ).min(0),
            ],
        ],
    )


def agent_detail() -> db.Dashboard:
    latency = f"airgossip_agent_push_latency_seconds_bucket{{{LINK}}}"
    step = "airgossip_agent_local_step_seconds"
    return dashboard(
        "airgossip-agent",
        "airgossip · agent detail",
        "One agent (or a few) up close: its pushes, what it refused, its local steps.",
        [
            [
                series(
                    "Push latency",
                    "From handing a message to the transport to the peer's acknowledgement "
                    "(delivered messages).",
                    "s",
                    *(
                        query(
                            f"histogram_quantile({q}, sum by (le, agent) "
                            f"(rate({latency}[{RATE}])))",
                            f"{{{{agent}}}} p{round(q * 100)}",
                            ref,
                        )
                        for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))
                    ),
                ).min(0),
                heatmap.Panel()
                .title("Push latency histogram")
                .description("Pushes per second by latency bucket (the agents selected).")
                .datasource(DATASOURCE)
                .with_target(
                    query(f"sum by (le) (rate({latency}[{RATE}]))", "{{le}}").format(
                        PromQueryFormat.HEATMAP
                    )
                ),
            ],
            [
                series(
                    "Refused messages by reason",
                    "Incoming messages each agent refused per second, by gRPC status and "
                    "reason (FAILED_PRECONDITION: measured from a base the agent no longer "
                    "holds, as after a restart; PERMISSION_DENIED: another task, fleet or "
                    "unknown sender; docs/security.md lists every reason).",
                    "short",
                    query(
                        "sum by (agent, code, reason) "
                        f"(rate(airgossip_agent_messages_rejected_total{{{AGENT}}}[{RATE}]))",
                        "{{agent}} {{code}} {{reason}}",
                    ),
                ).min(0),
                series(
                    "Local step time",
                    "Duration of each local optimisation step: mean and 90th percentile.",
                    "s",
                    query(
                        f"sum by (agent) (rate({step}_sum{{{AGENT}}}[{RATE}])) / "
                        f"sum by (agent) (rate({step}_count{{{AGENT}}}[{RATE}]))",
                        "{{agent}} mean",
                    ),
                    query(
                        f"histogram_quantile(0.9, sum by (le, agent) "
                        f"(rate({step}_bucket{{{AGENT}}}[{RATE}])))",
                        "{{agent}} p90",
                        "B",
                    ),
                ).min(0),
            ],
            insider_row(),
        ],
    )


def insider_row() -> list[Panel]:
    """What each in-neighbour's messages do to the agent, and the insider alerts firing
    (deploy/prometheus/alerts.yml; docs/security.md, "Detecting an insider")."""
    ratio = "airgossip_agent_in_neighbour_increment_ratio"
    absorbed = f"rate(airgossip_agent_in_neighbour_absorbed_total{{{LINK}}}[{RATE}])"

    def per_edge(counter: str) -> str:  # 0 for an in-neighbour with none
        return (
            f"sum by (agent, peer) (rate({counter}{{{LINK}}}[{RATE}])) "
            f"or sum by (agent, peer) (0 * {absorbed})"
        )

    return [
        series(
            "Relative increment per in-neighbour",
            "How far each in-neighbour's absorbed messages move the agent: distance of the value "
            "a message proposes from the agent's estimate, over the estimate's norm (mean). An "
            "insider forging pushes stands far above the agent's other in-neighbours.",
            "short",
            query(
                f"sum by (agent, peer) (rate({ratio}_sum{{{LINK}}}[{RATE}])) / "
                f"sum by (agent, peer) (rate({ratio}_count{{{LINK}}}[{RATE}]))",
                "{{agent}} ← {{peer}}",
            ),
        ).min(0),
        series(
            "Drift score per in-neighbour",
            "How persistently each in-neighbour's offers pull the agent one way: its mean "
            "displacement over about 20 rounds in multiples of the other in-neighbours' "
            "typical one (edge/algorithms/drift.py). At most about 3 for honest in-neighbours; "
            "10 or more is an accusation (AirgossipDriftingInsider). 0: the algorithm keeps no "
            "drift score (robust-push-sum does).",
            "short",
            query(
                f"max by (agent, peer) (airgossip_agent_in_neighbour_drift_score{{{LINK}}}) "
                f"or sum by (agent, peer) (0 * {absorbed})",
                "{{agent}} ← {{peer}}",
            ),
        ).min(0),
        series(
            "Refusals and clips per in-neighbour",
            "Messages of each in-neighbour the agent refused, and those its robust algorithm "
            "clipped, per second.",
            "short",
            query(
                per_edge("airgossip_agent_in_neighbour_refused_total"),
                "{{agent}} ← {{peer}} refused",
            ),
            query(
                per_edge("airgossip_agent_in_neighbour_clipped_total"),
                "{{agent}} ← {{peer}} clipped",
                "B",
            ),
        ).min(0),
        series(
            "Insider alerts firing",
            "Alerts of deploy/prometheus/alerts.yml firing, by the peer they name (0: none).",
            "short",
            query(
                'sum by (alertname, agent, peer) (ALERTS{alertstate="firing", '
                'alertname=~"Airgossip.*"}) or on () vector(0)',
                "{{alertname}} {{peer}}",
            ),
        ).min(0),
    ]


#: Every dashboard, by the file it is written to.
DASHBOARDS: dict[str, Callable[[], db.Dashboard]] = {
    "airgossip-fleet.json": fleet,
    "airgossip-network.json": network,
    "airgossip-agent.json": agent_detail,
}


def render(build: Callable[[], db.Dashboard]) -> str:
    """One dashboard as provisioning JSON."""
    model = build().build()
    text = JSONEncoder(sort_keys=True, indent=2).encode(model)
    return json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, build in DASHBOARDS.items():
        (OUT / name).write_text(render(build))
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()
