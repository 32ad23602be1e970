"""Draw a dashboard's panels from a real Prometheus into a PNG, laid out as Grafana lays
them out (Grafana itself is not needed: the panels' own queries, the same grid).

    python deploy/grafana/render.py deploy/grafana/dashboards/airgossip-fleet.json \\
        --prometheus http://127.0.0.1:9090 --minutes 10 --out fleet.png

Time series are drawn from ``query_range``, stat panels show the last value (through the
panel's value mappings), heatmaps the rate per latency bucket. ``$agent`` and ``$peer`` mean
every agent and peer (Grafana's "All"), ``$__rate_interval`` four scrape intervals.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

#: Grafana's grid: 24 columns; a height unit is 30 px, a column 1/24 of the width.
COLUMNS = 24
UNIT_INCHES = 0.42


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    times: np.ndarray
    values: np.ndarray


def substitute(
    expr: str, rate_interval: str = "20s", variables: dict[str, str] | None = None
) -> str:
    """A panel's expression with Grafana's variables replaced (every agent and peer)."""
    values = {"agent": ".*", "peer": ".*", **(variables or {})}
    expr = expr.replace("$__rate_interval", rate_interval)
    for name, value in values.items():
        expr = expr.replace(f"${name}", value)
    return expr


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> list[Series]:
    """Every series ``expr`` gives between ``start`` and ``end`` (NaN points dropped)."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body.get('error', body)}")
    out = []
    for result in body["data"]["result"]:
        points = np.array(result["values"], dtype=float).reshape(-1, 2)
        keep = np.isfinite(points[:, 1])
        out.append(Series(result["metric"], points[keep, 0], points[keep, 1]))
    return out


def legend(template: str, labels: dict[str, str]) -> str:
    if not template or template == "__auto":
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__")
    text = template
    for key, value in labels.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def scaled(unit: str, values: np.ndarray) -> tuple[np.ndarray, str]:
    """Values in the unit shown on the axis."""
    if unit == "percentunit":
        return values * 100, "%"
    if unit in ("Bps", "bps"):
        top = float(np.nanmax(values)) if values.size else 0.0
        for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")):
            if top >= factor:
                return values / factor, f"{prefix}{'B/s' if unit == 'Bps' else 'bit/s'}"
        return values, "B/s" if unit == "Bps" else "bit/s"
    if unit == "s":
        return values * 1000, "ms"
    return values, "" if unit in ("short", "") else unit


def _mapped(panel: dict[str, Any], value: float) -> str:
    for mapping in panel.get("fieldConfig", {}).get("defaults", {}).get("mappings", []):
        options = mapping.get("options", {})
        for key, result in options.items():
            if math.isclose(float(key), value):
                return str(result.get("text", key))
    decimals = panel.get("fieldConfig", {}).get("defaults", {}).get("decimals")
    return f"{value:.{int(decimals)}f}" if decimals is not None else f"{value:g}"


def render(
    dashboard: dict[str, Any],
    prometheus: str,
    start: float,
    end: float,
    out: Path,
    *,
    step: float = 5.0,
) -> dict[str, int]:
    """Draw every panel of ``dashboard`` into ``out``; return how many series each panel
    (``title``) and each of its queries (``title/refId``) got."""
    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    width = 20.0
    figure = plt.figure(figsize=(width, rows * UNIT_INCHES + 0.8))
    figure.suptitle(dashboard["title"], x=0.01, ha="left", fontsize=15, fontweight="bold")
    top = 1 - 0.8 / (rows * UNIT_INCHES + 0.8)
    counts: dict[str, int] = {}
    for panel in panels:
        grid = panel["gridPos"]
        left = grid["x"] / COLUMNS + 0.035
        bottom = top * (1 - (grid["y"] + grid["h"]) / rows) + 0.035
        axes = figure.add_axes((
            left, bottom, grid["w"] / COLUMNS - 0.05, top * grid["h"] / rows - 0.07
        ))  # fmt: skip
        axes.set_title(panel["title"], loc="left", fontsize=11)
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        drawn = 0
        for target in panel.get("targets", []):
            expr = substitute(target["expr"], f"{int(4 * step)}s")
            series = query_range(prometheus, expr, start, end, step)
            counts[f"{panel['title']}/{target.get('refId', 'A')}"] = len(series)
            drawn += len(series)
            if panel["type"] == "stat":
                name = target.get("legendFormat", "")
                text = [
                    f"{legend(name, s.labels)}: {_mapped(panel, s.values[-1])}"
                    for s in series
                    if s.values.size
                ]
                axes.text(0.5, 0.75 - 0.4 * (target.get("refId", "A") != "A"),
                          "\n".join(text) or "no data", ha="center", va="center",
                          fontsize=16, transform=axes.transAxes)  # fmt: skip
                axes.set_axis_off()
            elif panel["type"] == "heatmap":
                _heatmap(axes, series, start, end, step)
            else:
                for s in series:
                    values, shown = scaled(unit, s.values)
                    axes.plot((s.times - start) / 60, values, linewidth=1.2,
                              label=legend(target.get("legendFormat", ""), s.labels))  # fmt: skip
                    axes.set_ylabel(shown, fontsize=9)
        counts[panel["title"]] = drawn
        if panel["type"] == "timeseries":
            axes.set_xlim(0, (end - start) / 60)
            axes.set_xlabel("minutes", fontsize=8)
            axes.tick_params(labelsize=8)
            axes.grid(alpha=0.3)
            if axes.lines and len(axes.lines) <= 16:
                axes.legend(fontsize=7, loc="best", framealpha=0.6, ncols=2)
    figure.savefig(out, dpi=80)
    plt.close(figure)
    return counts


def _heatmap(axes: Any, series: list[Series], start: float, end: float, step: float) -> None:
    buckets = sorted(series, key=lambda s: float(s.labels.get("le", "inf")))
    times = np.arange(start, end + step, step)
    grid = np.zeros((len(buckets), len(times)))
    previous = np.zeros(len(times))
    for row, s in enumerate(buckets):  # cumulative buckets -> per-bucket rates
        cumulative = np.interp(times, s.times, s.values, left=0, right=0) if s.times.size else 0
        grid[row] = np.maximum(cumulative - previous, 0)
        previous = cumulative
    axes.imshow(grid, aspect="auto", origin="lower", cmap="viridis",
                extent=(0, (end - start) / 60, 0, len(buckets)))  # fmt: skip
    axes.set_yticks(np.arange(len(buckets)) + 0.5)
    axes.set_yticklabels([s.labels.get("le", "") for s in buckets], fontsize=6)
    axes.set_xlabel("minutes", fontsize=8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dashboard", type=Path)
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090")
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--end", type=float, default=None, help="unix time (default: now)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    end = args.end or time.time()
    counts = render(json.loads(args.dashboard.read_text()), args.prometheus,
                    end - 60 * args.minutes, end, args.out)  # fmt: skip
    empty = [title for title, n in counts.items() if "/" not in title and n == 0]
    print(f"wrote {args.out}" + (f"; no data for: {', '.join(empty)}" if empty else ""))


if __name__ == "__main__":
    main()
