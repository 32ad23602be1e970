"""Where the bulk path pays: pushes of growing size over the call and on the bulk path.

For each size (16 KiB to 128 MiB of float32), a receiver process and a sender of each way
(over the call, on the bulk path; plaintext and mutual TLS) take turns push by push, as in
``benchmarks.transport``; the median seconds a push of each. The bulk path costs a round
trip more than the call (the receiver's answer with its data port comes before the
payload) and saves the call's copies of every byte, so it pays from some size on: the
smallest size from which it is at least as fast in plaintext is what the transport's
default (:data:`airgossip.edge.transport.bulk.DEFAULT_BULK_BYTES`) should not be below. Over mutual
TLS Python's ``ssl`` costs about what gRPC's copies cost, so the bulk path is no faster; it is
taken from :data:`~airgossip.edge.transport.bulk.DEFAULT_BULK_BYTES_TLS` on for what else it gives a
large model (the receiver's memory bounded by the payload, a cut push resumed), where it
must cost no speed (within 10% of the call).

Run: ``python -m benchmarks --only bulk-threshold``.
"""

from __future__ import annotations

import statistics
from contextlib import ExitStack

from benchmarks.suite import Context, Outcome
from benchmarks.transport import ALWAYS_BULK, OVER_THE_CALL, Push, grpc_sender

#: Sizes pushed (float32 elements: 16 KiB .. 128 MiB) and pushes of each (full, quick).
SIZES = [1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 23, 1 << 24, 1 << 25]
PUSHES = (25, 8)
WAYS = {
    "call": (False, OVER_THE_CALL),
    "bulk": (False, ALWAYS_BULK),
    "call_tls": (True, OVER_THE_CALL),
    "bulk_tls": (True, ALWAYS_BULK),
}
#: How much slower than the call the bulk path may be over TLS from its default size on.
TLS_SLACK = 0.10


def medians(ctx: Context, numel: int, pushes: int) -> dict[str, float]:
    """Median seconds a push of each way, taking turns (first pushes not counted)."""
    seconds: dict[str, list[float]] = {name: [] for name in WAYS}
    with ExitStack() as stack:
        ways: dict[str, Push] = {
            name: stack.enter_context(grpc_sender(ctx, numel, secure, bulk_bytes=bulk))
            for name, (secure, bulk) in WAYS.items()
        }
        for turn in range(pushes + 1):
            for name, push in ways.items():
                took, _ = push()
                if turn:
                    seconds[name].append(took)
    return {name: statistics.median(s) for name, s in seconds.items()}


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def run(ctx: Context) -> list[Outcome]:
    from airgossip.edge.transport.bulk import DEFAULT_BULK_BYTES, DEFAULT_BULK_BYTES_TLS

    pushes = PUSHES[ctx.quick]
    rows, table = [], ["| size | over the call | bulk path | over the call, TLS | bulk path, TLS |"]
    table.append("|---|---|---|---|---|")
    for numel in SIZES:
        got = medians(ctx, numel, pushes)
        nbytes = 4 * numel
        rows.append((nbytes, got))
        cells = " | ".join(f"{1e3 * got[name]:.2f} ms" for name in WAYS)
        table.append(f"| {_size(nbytes)} | {cells} |")
        print(f"  {_size(nbytes)}: " + ", ".join(f"{n} {1e3 * t:.2f} ms" for n, t in got.items()))

    def pays_from(call: str, bulk: str) -> int | None:
        """The smallest size from which the bulk path is at least as fast at every size."""
        first = None
        for nbytes, got in rows:
            first = (first or nbytes) if got[bulk] <= got[call] else None
        return first

    plain, tls = pays_from("call", "bulk"), pays_from("call_tls", "bulk_tls")
    said = {k: _size(v) if v else "never" for k, v in (("plain", plain), ("tls", tls))}
    figures: dict[str, object] = {
        "pushes": pushes, "default_bulk_bytes": DEFAULT_BULK_BYTES,
        "default_bulk_bytes_tls": DEFAULT_BULK_BYTES_TLS, "table": "\n".join(table),
        "pays_from_bytes": plain, "pays_from_bytes_tls": tls,
        "median_s": {str(nbytes): got for nbytes, got in rows},
    }  # fmt: skip
    # Over TLS the bulk path is taken for the receiver's memory and for resuming cut pushes,
    # where it costs no speed: within TLS_SLACK of the call at every size from the default on.
    no_loss = all(
        got["bulk_tls"] <= (1 + TLS_SLACK) * got["call_tls"]
        for nbytes, got in rows
        if nbytes >= DEFAULT_BULK_BYTES_TLS
    )
    met = plain is not None and plain <= DEFAULT_BULK_BYTES and no_loss
    return [
        Outcome(
            "bulk-path threshold",
            "in plaintext the default bulk_bytes at or above the size from which the bulk path "
            "is at least as fast as the call; over mutual TLS the bulk path within 10% of the "
            "call from its default on (medians, same run)",
            f"bulk path as fast from {said['plain']} (plaintext), {said['tls']} (mutual TLS); "
            f"defaults {_size(DEFAULT_BULK_BYTES)} and {_size(DEFAULT_BULK_BYTES_TLS)}",
            met,
            figures,
        )
    ]
