"""When an agent calls the coordinator again: which refusals are worth retrying, and after
how long."""

from __future__ import annotations

import random
from collections.abc import Iterator

import grpc

#: gRPC codes that mean "try again later" rather than "you are refused".
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
#: Trailing metadata of a call refused for its rate (``RESOURCE_EXHAUSTED``): seconds to
#: wait before the next one. A full fleet is ``RESOURCE_EXHAUSTED`` too, without it: final.
RETRY_AFTER_KEY = "airgossip-retry-after-s"


def retry_after(err: grpc.RpcError) -> float | None:
    """Seconds the coordinator asks to wait before calling again (a call refused for its
    rate), or None for any other refusal."""
    if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    for key, value in err.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            try:
                return min(60.0, max(0.0, float(value)))
            except ValueError:
                return 1.0
    return None


def backoff_delays(base: float = 0.1, cap: float = 5.0) -> Iterator[float]:
    """Exponential backoff with full jitter: uniform(0, min(cap, base * 2**k))."""
    attempt = 0
    while True:
        yield random.uniform(0, min(cap, base * 2**attempt))
        attempt += 1
