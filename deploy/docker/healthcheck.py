"""Container health check: the gRPC health service in this container answers SERVING.

The address is ``AIRGOSSIP_HEALTH_ADDRESS`` (default ``127.0.0.1:7000``, an agent's gossip
port; the coordinator's is 7070). Where the service speaks mutual TLS, the check dials it as
the member it checks, with that member's own credentials: ``AIRGOSSIP_HEALTH_CERTS`` names
their folder (default: the private copy the image's entry point makes for an agent,
``/tmp/airgossip-tls``, when it exists; otherwise plaintext) and ``AIRGOSSIP_HEALTH_IDENTITY``
the member (default: the one certificate besides ``ca.pem`` in that folder). Exit status 0
when serving, 1 otherwise, as Docker's ``HEALTHCHECK`` expects.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from airgossip.common.security.tls import CA_CERT, SecurityError, TlsCredentials, dial

#: Where the entry point copies an agent's own credentials (deploy/docker/entrypoint.sh).
AGENT_TLS_DIR = Path("/tmp/airgossip-tls")


def credentials() -> TlsCredentials | None:
    """This container's member's credentials, or None where it speaks plaintext."""
    named = os.environ.get("AIRGOSSIP_HEALTH_CERTS")
    if not named and not AGENT_TLS_DIR.is_dir():
        return None
    folder = Path(named) if named else AGENT_TLS_DIR
    identity = os.environ.get("AIRGOSSIP_HEALTH_IDENTITY")
    if not identity:
        members = sorted(p.stem for p in folder.glob("*.pem") if p.name != CA_CERT)
        if len(members) != 1:
            raise SecurityError(
                f"{folder} holds {len(members)} certificates besides {CA_CERT}; name the one "
                "to check with in AIRGOSSIP_HEALTH_IDENTITY"
            )
        identity = members[0]
    return TlsCredentials.load(folder, identity)


def main() -> int:
    address = os.environ.get("AIRGOSSIP_HEALTH_ADDRESS", "127.0.0.1:7000")
    try:
        security = credentials()
    except SecurityError as err:
        print(f"{address}: {err}")
        return 1
    peer = security.identity if security else ""
    request = health_pb2.HealthCheckRequest(service="")
    try:
        with dial(address, peer, security) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=3.0)
    except grpc.RpcError as err:
        print(f"{address}: {err.code().name}")
        return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{address}{' (mutual TLS)' if security else ''}: {status}")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
