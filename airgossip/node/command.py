"""An agent process's command line, typed: one :class:`AgentCommand` for what people give
``airgossip agent`` and what fleets give the agent processes they start.

A fleet builds an :class:`AgentCommand` and starts an agent process (the emulation layer's
entry point) with :meth:`AgentCommand.argv`; the process parses it back with
:func:`parse_agent_command`. The
CLI's ``airgossip agent`` takes the same flags, with help for people
(``tests/system/test_runtime_command.py`` keeps the two the same).
"""

from __future__ import annotations

import argparse
import re
import sys
import typing
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import NoReturn

from airgossip.scenario.errors import ConfigError

#: What a run id given with ``--run-id`` may be.
RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
#: Flags whose name is not the field's.
_FLAG_NAMES = {"agent_id": "id"}


@dataclass(frozen=True)
class AgentCommand:
    """One agent process's flags (``airgossip agent --help`` says what each means)."""

    config: Path | None = None
    agent_id: str | None = None
    index: int = 0
    listen: str = "127.0.0.1:0"
    advertise: str | None = None
    coordinator: str | None = None
    peers: Path | None = None
    token: str = ""
    metrics_listen: str | None = None
    metrics_advertise: str | None = None
    metrics_tls: bool = False
    metrics_user: str | None = None
    metrics_password_file: Path | None = None
    stats_dir: Path | None = None
    linger_s: float = 10.0
    serve_until_stopped: bool = False
    ready_timeout_s: float = 120.0
    parent_pid: int | None = None
    threads: int | None = None
    host_agents: int | None = None
    link_shaping: bool = True
    kernel_links: str | None = None
    device: str | None = None
    certs: Path | None = None
    insecure: bool = False
    checkpoint_dir: Path | None = None
    checkpoint_interval_s: float = 5.0
    run_id: str | None = None

    def argv(self) -> list[str]:
        """The flags that differ from the defaults, as a command line."""
        out: list[str] = []
        for field in fields(self):
            value = getattr(self, field.name)
            if value == field.default:
                continue
            flag = flag_name(field.name)
            if isinstance(value, bool):
                out.append(flag if value else f"--no-{flag.removeprefix('--')}")
            else:
                out += [flag, str(value)]
        return out


def check_command(command: AgentCommand) -> None:
    """:class:`ConfigError` for flags that cannot go together or are out of range, before
    anything is read or imported (this module stays light: ``airgossip agent`` answers a bad
    flag at once)."""
    if (command.coordinator is None) == (command.peers is None):
        raise ConfigError("give exactly one of --coordinator HOST:PORT or --peers FILE")
    if (command.certs is None) == (not command.insecure):
        raise ConfigError(
            "give exactly one of --certs DIR (mutual TLS; see `airgossip certs`) or --insecure "
            "(plaintext)"
        )
    if not command.checkpoint_interval_s > 0:
        raise ConfigError(
            f"--checkpoint-interval-s must be positive, got {command.checkpoint_interval_s:g}"
        )
    if command.run_id is not None:
        if command.coordinator is not None:
            raise ConfigError(
                "--run-id names a run of static peers; with --coordinator the coordinator "
                "names the run"
            )
        if not RUN_ID.fullmatch(command.run_id):
            raise ConfigError(
                f"--run-id {command.run_id[:80]!r}: 1-128 letters, digits, '.', '_', ':' or '-'"
            )
    if command.peers is not None and command.config is None:
        raise ConfigError("--peers needs --config (the scenario every agent of the list runs)")
    if command.threads is not None and command.threads < 1:
        raise ConfigError(f"--threads must be 1 or more, got {command.threads}")
    if command.host_agents is not None and command.host_agents < 1:
        raise ConfigError(f"--host-agents must be 1 or more, got {command.host_agents}")
    if command.index < 0:
        raise ConfigError(f"--index must be 0 or more, got {command.index}")
    if command.kernel_links is not None and not command.link_shaping:
        raise ConfigError("--kernel-links shapes the links: it cannot go with --no-link-shaping")


def flag_name(field: str) -> str:
    """The command-line flag of an :class:`AgentCommand` field (``stats_dir``: ``--stats-dir``)."""
    return "--" + _FLAG_NAMES.get(field, field).replace("_", "-")


def _value_type(annotation: object) -> type:
    """The type a flag's value is read as: ``Path | None`` reads a ``Path``."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    kind = options[0]
    assert isinstance(kind, type), annotation
    return kind


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, as every error of an agent process (the fleets read it from its log).
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_agent_command(argv: list[str], prog: str = "airgossip agent") -> AgentCommand:
    """Parse what :meth:`AgentCommand.argv` wrote (``SystemExit(2)`` and one error line for
    anything else); ``prog`` names the program in its usage."""
    parser = _Parser(prog=prog, description=AgentCommand.__doc__)
    hints = typing.get_type_hints(AgentCommand)
    for field in fields(AgentCommand):
        kind = _value_type(hints[field.name])
        flag = flag_name(field.name)
        assert field.default is not MISSING
        if kind is bool:
            # --link-shaping and --no-link-shaping, say.
            parser.add_argument(
                flag, dest=field.name, action=argparse.BooleanOptionalAction, default=field.default
            )
        else:
            parser.add_argument(flag, dest=field.name, type=kind, default=field.default)
    return AgentCommand(**vars(parser.parse_args(argv)))
