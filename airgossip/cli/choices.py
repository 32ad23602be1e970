"""What a command accepts, named in its help from the registries themselves.

A help text names a registry with a placeholder (``{modes}``, ``{topologies}``...), filled
when the help is shown (:class:`RegistryHelpCommand`). :data:`CHOICES` says how each is read
from its registry. The registries list their names without importing what they register
(:class:`~airgossip.common.plugins.PluginRegistry`: an algorithm, a task or a fleet mode is
imported when it is looked up), so a help text costs no torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import click
import typer.core
import typer.rich_utils
from rich.table import Table


def _topologies() -> str:
    from airgossip.common.topology import TOPOLOGIES

    return ", ".join(TOPOLOGIES)


def _named_topologies() -> str:
    from airgossip.common.topology import TOPOLOGIES

    return ", ".join(name for name in TOPOLOGIES if name != "edges")


def _algorithms() -> str:
    from airgossip.edge.algorithms import ALGORITHMS

    return ", ".join(ALGORITHMS)


def _tasks() -> str:
    from airgossip.edge.tasks import BUILTIN_TASKS

    return ", ".join(BUILTIN_TASKS)


def _app_free_tasks() -> str:
    from airgossip.edge.tasks import BUILTIN_TASKS

    return ", ".join(name for name in BUILTIN_TASKS if name != "flower")


def _codecs() -> str:
    from airgossip.edge.compression import CODEC_FORMS

    return ", ".join(CODEC_FORMS)


def _modes() -> str:
    from airgossip.emulation.fleets import modes_help

    return modes_help()


def _mode_names() -> str:
    from airgossip.emulation.fleets import FLEETS

    return ", ".join(FLEETS)


def _presets() -> str:
    from airgossip.scenario.wireless import preset_names

    return ", ".join(preset_names())


#: Each placeholder and what fills it: the names its registry holds, in its order.
CHOICES: dict[str, Callable[[], str]] = {
    "topologies": _topologies,
    "named_topologies": _named_topologies,
    "algorithms": _algorithms,
    "tasks": _tasks,
    "app_free_tasks": _app_free_tasks,
    "codecs": _codecs,
    "modes": _modes,
    "mode_names": _mode_names,
    "presets": _presets,
}
_PLACEHOLDER = re.compile(r"\{(" + "|".join(CHOICES) + r")\}")


@cache
def registry_names() -> dict[str, str]:
    """What every placeholder names, read from the registries (once a process)."""
    return {name: read() for name, read in CHOICES.items()}


def fill(text: str) -> str:
    """``text`` with every placeholder replaced by what its registry names."""
    return _PLACEHOLDER.sub(lambda m: registry_names()[m.group(1)], text)


class _OptionsTable(Table):
    """Typer's table of a command's options, whose option names are never cut.

    Rich shrinks the widest columns of a table together when it is too wide, names and help
    alike: at 80 columns ``--checkpoint-interval-s`` read ``--checkpoint-interva…``. Here
    every column but the last two (the metavar, which folds, and the help, which wraps)
    keeps its width, and the help wraps into what is left."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*renderables, **kwargs)
        for column in self.columns[:-2]:
            column.no_wrap = True


@contextmanager
def _option_names_kept() -> Iterator[None]:
    """Typer's help rendered with :class:`_OptionsTable` (it builds its tables by name)."""
    table = typer.rich_utils.Table  # type: ignore[attr-defined]
    typer.rich_utils.Table = _OptionsTable  # type: ignore[attr-defined]
    try:
        yield
    finally:
        typer.rich_utils.Table = table  # type: ignore[attr-defined]


class HelpCommand(typer.core.TyperCommand):
    """A command whose help keeps every option name whole at any width (80 columns)."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with _option_names_kept():
            super().format_help(ctx, formatter)


class RegistryHelpCommand(HelpCommand):
    """A command whose help names what the registries hold, read when shown.

    Placeholders are filled in the command's own help and in its options'. A positional
    argument's accepted values are said in the command's help: whether a CLI library shows
    an argument's own help at all has changed between releases (click 8.5 with typer 0.20
    drops it), while a command's help is always shown."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.help:
            self.help = fill(self.help)
        for param in self.params:
            text = getattr(param, "help", None)
            if isinstance(text, str):
                setattr(param, "help", fill(text))  # noqa: B010 (not every Parameter declares it)
        super().format_help(ctx, formatter)
