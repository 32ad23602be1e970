"""Runs side by side: ours and Flower's baselines, read the same way (``RunResults``).

Each run's accuracy is the mean over its nodes of the test accuracy each reports (an agent
on its own estimate, a Flower ClientApp on the global model) after every round; bytes are
what crossed the network so far (ours: every gossip message as sent; Flower's: every
message to and from the server); wall time is per round since the run's learning started
(agents running, or the ServerApp started), and ``total_wall_s`` the whole command.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from airgossip.scenario.config import ConfigError
from airgossip.scenario.results import RoundFigures, RunResults


@dataclass(frozen=True)
class ComparedRun:
    """One run folder and its results."""

    path: Path
    results: RunResults

    @property
    def name(self) -> str:
        return self.path.name or str(self.path)

    @property
    def system(self) -> str:
        """What ran: Flower's baseline or our fleet, in a few words."""
        config = self.results.config
        agents = config.get("agents", "?")
        if config.get("baseline") == "flower":
            return f"Flower {config.get('server_app', 'ServerApp')} · {agents} nodes"
        network = config.get("network", {})
        loss = network.get("loss") if isinstance(network, dict) else None
        parts = [
            f"airgossip {config.get('algorithm', '?')}",
            str(config.get("topology", "?")),
            f"{agents} agents",
        ]
        if config.get("compression", "none") != "none":
            parts.insert(1, str(config["compression"]))
        if config.get("wireless"):
            parts.append("wireless")
        elif loss is not None:
            parts.append(f"loss {loss}")
        parts.append(str(config.get("mode", "?")))
        return " · ".join(parts)

    @property
    def curve(self) -> list[RoundFigures]:
        return [r for r in self.results.rounds if r.mean_accuracy is not None]


@dataclass(frozen=True)
class ComparisonRow:
    """One run's figures in the comparison table (None: never reached / not reported)."""

    name: str
    system: str
    rounds: int
    final_accuracy: float | None
    best_accuracy: float | None
    megabytes: float
    wall_s: float
    total_wall_s: float
    target_round: int | None
    target_megabytes: float | None
    target_wall_s: float | None


def load_runs(paths: Sequence[Path]) -> list[ComparedRun]:
    """Every folder's ``results.json``; :class:`ConfigError` naming a folder that has none."""
    if not paths:
        raise ConfigError("give at least one run folder")
    runs = []
    for path in paths:
        file = path / "results.json" if path.is_dir() or not path.suffix else path
        try:
            runs.append(ComparedRun(file.parent, RunResults.read(file)))
        except ValueError as err:
            raise ConfigError(str(err)) from None
    return runs


def comparison_rows(runs: Sequence[ComparedRun], target: float) -> list[ComparisonRow]:
    """The table: final and best accuracy, bytes and time in all, and what it took to
    reach ``target`` mean accuracy first."""
    rows = []
    for run in runs:
        final = run.results.final
        curve = run.curve
        reached = next((r for r in curve if (r.mean_accuracy or 0.0) >= target), None)
        rows.append(
            ComparisonRow(
                name=run.name,
                system=run.system,
                rounds=final.round,
                final_accuracy=final.mean_accuracy,
                best_accuracy=max((r.mean_accuracy or 0.0 for r in curve), default=None),
                megabytes=final.bytes_sent / 1e6,
                wall_s=final.train_wall_s,
                total_wall_s=run.results.total_wall_s,
                target_round=reached.round if reached else None,
                target_megabytes=reached.bytes_sent / 1e6 if reached else None,
                target_wall_s=reached.train_wall_s if reached else None,
            )
        )
    return rows


def plot_comparison(path: Path, runs: Sequence[ComparedRun], target: float) -> None:
    """PNG of mean accuracy against round, against megabytes moved and against wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), sharey=True)
    for run in runs:
        curve = run.curve
        if not curve:
            continue
        accuracy = [r.mean_accuracy for r in curve]
        label = f"{run.name}: {run.system}"
        axes[0].plot([r.round for r in curve], accuracy, marker=".", label=label)
        axes[1].plot([r.bytes_sent / 1e6 for r in curve], accuracy, marker=".")
        axes[2].plot([r.train_wall_s for r in curve], accuracy, marker=".")
    for ax, xlabel in zip(
        axes, ("round", "megabytes moved (all nodes)", "wall time (s)"), strict=True
    ):
        ax.set_xlabel(xlabel)
        ax.axhline(target, color="grey", linestyle=":", linewidth=1)
        ax.grid(alpha=0.3)
    from matplotlib.ticker import MaxNLocator

    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("mean test accuracy")
    axes[0].set_ylim(0, 1)
    axes[0].legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
