"""``airgossip certs``: a fleet's certificate authority and its members' certificates.

``init`` makes the authority (``ca.pem``, ``ca.key``) of one fleet; ``issue ID`` a
certificate and key for one agent (or ``coordinator``). A device needs ``ca.pem``, its
``ID.pem`` and ``ID.key`` (``--out`` writes exactly that set into a folder of its own);
``ca.key`` never leaves the machine that issues certificates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from airgossip.cli.display import console, fail

certs_app = typer.Typer(
    name="certs",
    help="Make a fleet's certificate authority and issue its members' certificates (mTLS).",
    no_args_is_help=True,
)

FolderOption = Annotated[
    Path, typer.Option("--dir", help="Folder of the certificate authority (ca.pem, ca.key).")
]
#: ``--insecure`` of the commands that serve or dial gRPC.
InsecureOption = Annotated[
    bool, typer.Option("--insecure", help="Plaintext gRPC, no certificates (trusted networks).")
]


def require_transport_choice(certs: Path | None, insecure: bool) -> None:
    """One-line error unless exactly one of ``--certs`` or ``--insecure`` was given: plaintext
    is never what a command falls back to."""
    if (certs is None) == (not insecure):
        fail(
            "give exactly one of --certs DIR (mutual TLS; see `airgossip certs`) or --insecure "
            "(plaintext)"
        )


@certs_app.command("init")
def init(
    folder: FolderOption = Path("certs"),
    name: Annotated[str, typer.Option(help="Name of the authority (its subject).")] = (
        "airgossip fleet"
    ),
    days: Annotated[float, typer.Option(help="How long the authority is valid.")] = 3650,
    force: Annotated[bool, typer.Option(help="Replace an existing authority.")] = False,
) -> None:
    """Create a fleet's certificate authority (ca.pem and ca.key)."""
    from airgossip.common.security.certificates import init_authority
    from airgossip.common.security.tls import SecurityError

    if days <= 0:
        fail(f"--days must be positive, got {days:g}")
    try:
        path = init_authority(folder, name=name, days=days, overwrite=force)
    except (SecurityError, OSError) as err:
        fail(str(err))
    console.print(
        f"certificate authority {path} (key {folder / 'ca.key'}, keep it off the devices); "
        f"next: airgossip certs issue coordinator --dir {folder}, then one per agent",
        highlight=False,
        soft_wrap=True,
    )


@certs_app.command("issue")
def issue(
    identity: Annotated[str, typer.Argument(show_default=False)],
    folder: FolderOption = Path("certs"),
    out: Annotated[
        Path | None,
        typer.Option(help="Write ID.pem, ID.key and a copy of ca.pem here (default: --dir)."),
    ] = None,
    days: Annotated[float, typer.Option(help="How long the certificate is valid.")] = 365,
    force: Annotated[bool, typer.Option(help="Replace an existing certificate.")] = False,
) -> None:
    """Issue a certificate and key naming IDENTITY, signed by the authority in --dir.

    IDENTITY is the agent id (or 'coordinator').
    """
    from airgossip.common.security.certificates import issue as issue_certificate
    from airgossip.common.security.tls import SecurityError

    if days <= 0:
        fail(f"--days must be positive, got {days:g}")
    try:
        cert, key = issue_certificate(folder, identity, out=out, days=days, overwrite=force)
    except (SecurityError, OSError) as err:
        fail(str(err))
    console.print(
        f"issued {cert} and {key} for {identity!r} (valid {days:g} days)",
        highlight=False,
        soft_wrap=True,
    )
