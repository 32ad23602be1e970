"""The options that guard a process's metrics endpoint, shared by ``airgossip coordinator`` and
``airgossip agent``: TLS with the process's own certificate, HTTP basic auth, or both.
Without them the endpoint is plain HTTP, for loopback and demos."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from airgossip.cli.display import fail

if TYPE_CHECKING:  # the CLI imports the observability code only when it runs
    from airgossip.common.http import HttpSecurity

MetricsTlsOption = Annotated[
    bool,
    typer.Option(
        "--metrics-tls",
        help="Serve the metrics port over TLS with this process's certificate from --certs "
        "(Prometheus: tls_config with the fleet's ca.pem and the server name "
        "airgossip-metrics).",
    ),
]
MetricsUserOption = Annotated[
    str | None,
    typer.Option(
        "--metrics-user",
        help="HTTP basic auth user every request to the metrics port must give (its "
        "password: the password file below).",
    ),
]
MetricsPasswordFileOption = Annotated[
    Path | None,
    typer.Option(
        "--metrics-password-file",
        help="File whose first line is the basic auth password (Prometheus reads the same "
        "file: password_file of its basic_auth).",
    ),
]


def metrics_security(
    certs: Path | None, identity: str, tls: bool, user: str | None, password_file: Path | None
) -> HttpSecurity:
    """What guards the metrics port, from the options (one-line error for a bad set)."""
    from airgossip.common.http import http_security

    try:
        return http_security(certs, identity, tls=tls, user=user, password_file=password_file)
    except ValueError as err:
        fail(str(err))
