"""Container health check: the gRPC health service in this container answers SERVING.

The address is ``AIRGOSSIP_HEALTH_ADDRESS`` (default ``127.0.0.1:7000``, an agent's gossip
port; the coordinator's is 7070). Exit status 0 when serving, 1 otherwise, as Docker's
``HEALTHCHECK`` expects.
"""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main() -> int:
    address = os.environ.get("AIRGOSSIP_HEALTH_ADDRESS", "127.0.0.1:7000")
    request = health_pb2.HealthCheckRequest(service="")
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=3.0)
    except grpc.RpcError as err:
        print(f"{address}: {err.code().name}")
        return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    print(f"{address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
