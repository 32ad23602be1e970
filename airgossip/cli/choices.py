"""What a command accepts, named in its help from the registries themselves.

A help text names a registry with a placeholder (``{modes}``, ``{topologies}``...), filled
when the help is shown (:class:`RegistryHelpCommand`): most registries import torch, which
the CLI imports only when a command runs, so ``airgossip --help`` stays fast and the lists
never go stale. :data:`CHOICES` says what each placeholder names.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import click
import typer.core


def _topologies() -> str:
    from edge.topology import TOPOLOGIES

    return ", ".join(TOPOLOGIES)


def _named_topologies() -> str:
    from edge.topology import TOPOLOGIES

    return ", ".join(name for name in TOPOLOGIES if name != "edges")


def _algorithms() -> str:
    from edge.algorithms import ALGORITHMS

    return ", ".join(ALGORITHMS)


def _tasks() -> str:
    from edge.tasks import BUILTIN_TASKS

    return ", ".join(BUILTIN_TASKS)


def _app_free_tasks() -> str:
    from edge.tasks import BUILTIN_TASKS

    return ", ".join(name for name in BUILTIN_TASKS if name != "flower")


def _codecs() -> str:
    from edge.compression import CODEC_FORMS

    return ", ".join(CODEC_FORMS)


def _modes() -> str:
    from emulation.fleets import modes_help

    return modes_help()


def _presets() -> str:
    from emulation.scenario import preset_names

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
    "presets": _presets,
}
_PLACEHOLDER = re.compile(r"\{(" + "|".join(CHOICES) + r")\}")


def fill(text: str) -> str:
    """``text`` with every placeholder replaced by what its registry names."""
    return _PLACEHOLDER.sub(lambda m: CHOICES[m.group(1)](), text)


class RegistryHelpCommand(typer.core.TyperCommand):
    """A command whose options' help names what the registries hold, read when shown."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for param in self.params:
            text = getattr(param, "help", None)
            if isinstance(text, str):
                param.help = fill(text)  # type: ignore[attr-defined]
        super().format_help(ctx, formatter)
