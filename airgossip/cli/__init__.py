"""The ``airgossip`` command line: one module per command, one for what it shows.

``run`` (a whole fleet on this machine), ``agent`` (one agent, what runs on each device),
``coordinator`` (the optional control plane), ``topology`` and ``links`` (describe a graph
or a wireless scenario), ``baseline`` (an app on another system's runtime: Flower's),
``compare`` (runs side by side), ``certs`` (a fleet's TLS certificates) and ``compose`` (a
compose file for a fleet in containers). Commands import the heavy parts (torch, the fleets,
Flower) only when they run, so ``--help`` stays fast, and check their flags first
(:mod:`airgossip.cli.early`), so a bad one is answered at once.
"""

from __future__ import annotations

import os
from importlib import metadata
from typing import Annotated

import typer

from airgossip.cli.agent import agent
from airgossip.cli.baseline import baseline_app
from airgossip.cli.certs import certs_app
from airgossip.cli.choices import HelpCommand, RegistryHelpCommand
from airgossip.cli.compare import compare
from airgossip.cli.compose import compose
from airgossip.cli.coordinator import coordinator
from airgossip.cli.links import links_command
from airgossip.cli.run import run
from airgossip.cli.topology import topology_info

# gRPC's core logs every refused TLS handshake at INFO: a line per connection attempt of
# whoever knocks without a valid certificate. Commands import grpc only when they run.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

app = typer.Typer(
    name="airgossip",
    help="Decentralized learning over directed, lossy links: gossip agents that need no server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def version() -> str:
    """The installed package's version (its metadata), else the source tree's."""
    try:
        return metadata.version("airgossip")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        from airgossip import __version__

        return __version__


def _show_version(shown: bool) -> None:
    if shown:
        typer.echo(f"airgossip {version()}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Decentralized learning over directed, lossy links: gossip agents that need no server."""


# Help that names what a command accepts reads it from the registries when shown.
app.command("run", cls=RegistryHelpCommand)(run)
app.command("agent", cls=HelpCommand)(agent)
app.command("coordinator", cls=RegistryHelpCommand)(coordinator)
app.command("topology", cls=RegistryHelpCommand)(topology_info)
app.command("links", cls=RegistryHelpCommand)(links_command)
app.add_typer(baseline_app, name="baseline")
app.command("compare", cls=HelpCommand)(compare)
app.add_typer(certs_app)
app.command("compose", cls=RegistryHelpCommand)(compose)


def main() -> None:
    app()


__all__ = ["app", "main", "version"]
