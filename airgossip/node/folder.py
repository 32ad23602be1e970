"""A run's folder: what goes where, and what only its owner may read.

One ``airgossip run`` writes everything under one folder::

    config.json        the launch config every agent process reads
    agents/            each agent's round records (<id>.jsonl) and estimates
    logs/              each agent's log
    checkpoints/<id>/  each agent's checkpoints
    certs/             the run's throwaway credentials: ca.pem, and one folder per member
                       with ca.pem, <id>.pem and <id>.key
    results.json, results.png, kernel.json, ...   what the run found

Everything in it is its owner's only, whatever the umask: folders 0700, files 0600, each
made so by the call that creates it (:mod:`airgossip.common.security.private_files`).

The throwaway certificate authority's key never touches the disk: every member's
certificate is issued while it is in memory, so no agent process (or container) can read it,
and an agent's ``--certs`` folder holds its own key and the CA's certificate, nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from airgossip.common.security.certificates import make_authority, make_certificate
from airgossip.common.security.private_files import private_folder, write_private
from airgossip.common.security.tls import CA_CERT, TlsCredentials
from airgossip.scenario.config import ConfigError, RunConfig

#: What a run leaves in its output folder: a second run there would mix the two.
RUN_OUTPUTS = ("results.json", "agents", "logs")
#: How long a run's throwaway certificates are valid.
CERTIFICATE_DAYS = 7.0


def refuse_used_out_dir(out_dir: Path) -> None:
    """``ConfigError`` if ``out_dir`` already holds a run's results or agent files."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"output folder {out_dir} exists and is not a folder")
    used = [name for name in RUN_OUTPUTS if (out_dir / name).exists()]
    if used:
        raise ConfigError(
            f"output folder {out_dir} already holds a run ({', '.join(used)}); "
            "choose a new --out or remove it"
        )


@dataclass(frozen=True)
class RunFolder:
    """A run's output folder (see the module docstring for what goes where)."""

    path: Path

    @property
    def config_path(self) -> Path:
        """The launch config every agent process reads."""
        return self.path / "config.json"

    @property
    def records_dir(self) -> Path:
        """Each agent's round records and estimates."""
        return self.path / "agents"

    @property
    def logs_dir(self) -> Path:
        """Each agent's log."""
        return self.path / "logs"

    @property
    def checkpoints_dir(self) -> Path:
        """Every agent's checkpoint folder."""
        return self.path / "checkpoints"

    @property
    def certs_dir(self) -> Path:
        """The run's throwaway credentials, one folder per member."""
        return self.path / "certs"

    def refuse_used(self) -> None:
        """:class:`ConfigError` if the folder already holds a run."""
        refuse_used_out_dir(self.path)

    def write_config(self, config: RunConfig) -> Path:
        """Make the folder (private, like everything in it) and write the launch config every
        agent reads; its path."""
        self.make()
        text = json.dumps(config.model_dump(mode="json"), indent=2) + "\n"
        return write_private(self.config_path, text)

    def make(self) -> Path:
        """The folder made private (0700) with its ``agents`` and ``logs``; its path."""
        private_folder(self.path)
        private_folder(self.records_dir)
        private_folder(self.logs_dir)
        return self.path

    def checkpoint_dir(self, agent_id: str) -> Path:
        """``agent_id``'s checkpoint folder, made private (0700, in a 0700 folder)."""
        private_folder(self.checkpoints_dir)
        return private_folder(self.checkpoints_dir / agent_id)

    def credentials(self, identity: str) -> Path:
        """The folder of ``identity``'s credentials: ``ca.pem``, its certificate and key."""
        return self.certs_dir / identity

    def load_credentials(self, identity: str) -> TlsCredentials:
        """``identity``'s credentials, as issued by :meth:`issue_credentials`."""
        return TlsCredentials.load(self.credentials(identity), identity)

    def issue_credentials(self, identities: Iterable[str]) -> None:
        """A throwaway authority (its key only in memory) and a private folder of
        credentials for each of ``identities``; the CA's certificate also at
        ``certs/ca.pem`` (it is public)."""
        authority, key = make_authority("airgossip run", days=CERTIFICATE_DAYS)
        ca_pem = authority.public_bytes(serialization.Encoding.PEM)
        private_folder(self.certs_dir)
        write_private(self.certs_dir / CA_CERT, ca_pem)
        for identity in identities:
            cert_pem, key_pem = make_certificate(authority, key, identity, days=CERTIFICATE_DAYS)
            folder = private_folder(self.credentials(identity))
            write_private(folder / CA_CERT, ca_pem)
            write_private(folder / f"{identity}.pem", cert_pem)
            write_private(folder / f"{identity}.key", key_pem)
