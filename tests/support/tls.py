"""The test session's certificate authority: one throwaway CA, a certificate per identity."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
import threading
from pathlib import Path

from airgossip.common.security.certificates import throwaway_fleet
from airgossip.common.security.tls import COORDINATOR_IDENTITY, TlsCredentials

#: Identities the tests' certificate authority has certificates for.
TEST_IDENTITIES = (*(f"agent-{i}" for i in range(16)), COORDINATOR_IDENTITY, "mallory")


_MADE = threading.Lock()


@functools.cache
def _folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="airgossip-test-certs-"))
    atexit.register(shutil.rmtree, folder, True)
    return throwaway_fleet(folder, TEST_IDENTITIES)


def credentials_folder() -> Path:
    """One throwaway CA for the whole test session, with a certificate for each of
    :data:`TEST_IDENTITIES` (the folder is removed when the session ends); safe to call
    from several threads at once (one CA, made once)."""
    with _MADE:
        return _folder()


def credentials(identity: str) -> TlsCredentials:
    """The test CA's credentials of ``identity``."""
    return TlsCredentials.load(credentials_folder(), identity)
