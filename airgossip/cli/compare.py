"""``airgossip compare``: runs side by side, ours and Flower's, as a table and a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from airgossip.cli.display import console, fail, fmt


def compare(
    runs: Annotated[list[Path], typer.Argument(show_default=False)],
    out: Annotated[Path, typer.Option(help="Where to write the plot (PNG).")] = Path(
        "comparison.png"
    ),
    target: Annotated[
        float, typer.Option(help="Accuracy whose first crossing the table reports.")
    ] = 0.9,
) -> None:
    """Compare runs: accuracy against round, bytes moved and wall time.

    RUNS are run folders, each with its results.json.
    """
    if not 0 < target <= 1:
        fail(f"--target must be within (0, 1], got {target}")
    if out.suffix.lower() != ".png":
        fail(f"--out must name a .png file, got {out}")
    for run in runs:  # before the plotting and results code is imported
        file = run / "results.json" if run.is_dir() or not run.suffix else run
        if not file.exists():
            fail(f"{file} does not exist")

    from airgossip.emulation.compare import comparison_rows, load_runs, plot_comparison
    from airgossip.scenario.config import ConfigError

    try:
        loaded = load_runs(runs)
    except ConfigError as err:
        fail(str(err))
    rows = comparison_rows(loaded, target)
    for row in rows:
        console.print(f"{row.name}: {row.system}", highlight=False, soft_wrap=True)
    # MB: bytes every node sent in all; wall s: learning time; total s: the whole command.
    table = Table(title_justify="left")
    for column in ("run", "rounds", "accuracy", "best", "MB", "wall s", "total s",
                   f"to {target:g}: round/MB/s"):  # fmt: skip
        table.add_column(column)
    for row in rows:
        reached = (
            "never"
            if row.target_round is None
            else f"{row.target_round} / {row.target_megabytes:.2f} / {row.target_wall_s:.1f}"
        )
        table.add_row(
            row.name, str(row.rounds), fmt(row.final_accuracy, 3), fmt(row.best_accuracy, 3),
            f"{row.megabytes:.2f}", f"{row.wall_s:.1f}", f"{row.total_wall_s:.1f}", reached,
        )  # fmt: skip
    console.print(table)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        plot_comparison(out, loaded, target)
    except OSError as err:
        fail(f"cannot write {out}: {err.strerror}", code=1)
    console.print(f"plot: {out.resolve()}", highlight=False, soft_wrap=True)
