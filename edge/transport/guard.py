"""What keeps a gRPC server standing under hostile or broken clients.

Shared by the agent's gossip server and the coordinator:

* :class:`RefusalLog`: one log line per refusal reason at a bounded rate, never a traceback;
* :class:`StreamWatchdog`: a deadline and a progress timeout on every inbound stream (gRPC's
  own deadline is the client's to choose, and a hostile client chooses none);
* :class:`StreamSlots`: at most one inbound stream per key (a directed edge) at a time, and
  a bound on all of them together, so that pushes never hold every server thread and
  health checks are always answered;
* :func:`raw_unary`, :func:`raw_unary_stream`, :func:`raw_stream_unary`: method handlers
  that take the request's raw bytes. Handlers parse them themselves: gRPC's own deserialiser
  keeps about 16 KB per call that fails to parse, and logs a traceback for each;
* :func:`parsed_service`: a whole service on raw bytes, each request parsed here and handed
  to the servicer's method as usual (an undecodable one is refused and counted);
* :class:`RefusalCounts`: refused calls by method and reason, for a metrics collector;
* :class:`HealthService`: the standard health check (``Check`` only) on raw bytes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2


class RefusalLog:
    """Logs refusals: one line per reason at most every ``interval_s``, with a count of the
    ones held back since, so that a flood of bad calls cannot flood the log.

    Parameters
    ----------
    logger:
        Where the lines go (warnings).
    interval_s:
        Shortest time between two lines of the same reason.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def note(self, reason: str, text: str) -> bool:
        """Log ``text`` for refusal ``reason`` unless one was logged lately; True if logged.

        ``reason`` must come from a fixed vocabulary (it keys a dict that must stay small).
        """
        now = self.clock()
        with self._lock:
            last = self._last.get(reason)
            if last is not None and now - last < self.interval_s:
                self._held[reason] = self._held.get(reason, 0) + 1
                return False
            held = self._held.pop(reason, 0)
            self._last[reason] = now
        more = f" (and {held} more refused for {reason} since)" if held else ""
        self.logger.warning("refused (%s): %s%s", reason, text[:300], more)
        return True


def cancel_with_status(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """End a call from outside its handler's thread, telling the client why.

    gRPC's public ``cancel()`` only says ``CANCELLED``; the call object beneath it can carry
    a status, and is used where present.
    """
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    try:
        call.cancel(code.value[0], details)  # type: ignore[union-attr]
    except Exception:  # another gRPC build: the public way, without the reason
        context.cancel()


@dataclass
class Watch:
    """One watched stream (see :meth:`StreamWatchdog.watch`)."""

    context: grpc.ServicerContext
    clock: Callable[[], float] = field(repr=False)
    started: float = 0.0
    deadline: float = 0.0
    last_progress: float = 0.0
    #: Why the watchdog ended the stream (``stream_deadline``, ``stream_stalled``), or None.
    expired: str | None = None

    def progress(self) -> None:
        """A message arrived."""
        self.last_progress = self.clock()

    def extend(self, seconds: float) -> None:
        """Let the stream last ``seconds`` from its start (once the header says how much
        will come)."""
        self.deadline = self.started + seconds


class StreamWatchdog:
    """Ends inbound streams that run past a deadline or go quiet for too long.

    One thread for all streams of a server, started with the first one. A stream is ended
    with ``DEADLINE_EXCEEDED`` and a reason; the handler then sees its request iterator end
    and can ask its :class:`Watch` why.

    Parameters
    ----------
    deadline_s:
        Longest a stream may last unless its handler :meth:`Watch.extend` s it.
    progress_timeout_s:
        Longest a stream may go without a message (the first one included).
    tick_s:
        How often streams are checked.
    """

    def __init__(
        self,
        *,
        deadline_s: float = 60.0,
        progress_timeout_s: float = 10.0,
        tick_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deadline_s = deadline_s
        self.progress_timeout_s = progress_timeout_s
        self.tick_s = tick_s
        self.clock = clock
        self._lock = threading.Lock()
        self._by_id: dict[int, Watch] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @contextmanager
    def watch(self, context: grpc.ServicerContext) -> Iterator[Watch]:
        """Watch one stream for the duration of the ``with`` block."""
        now = self.clock()
        watch = Watch(context, self.clock, now, now + self.deadline_s, now)
        key = id(watch)
        with self._lock:
            self._by_id[key] = watch
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="stream-watchdog", daemon=True
                )
                self._thread.start()
        try:
            yield watch
        finally:
            with self._lock:
                self._by_id.pop(key, None)

    def active(self) -> int:
        """Streams watched now."""
        with self._lock:
            return len(self._by_id)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            now = self.clock()
            with self._lock:
                watches = list(self._by_id.values())
            for watch in watches:
                if watch.expired is not None:
                    continue
                if now > watch.deadline:
                    reason, text = (
                        "stream_deadline",
                        (
                            f"the push took longer than its {watch.deadline - watch.started:.0f} s "
                            "deadline"
                        ),
                    )
                elif now - watch.last_progress > self.progress_timeout_s:
                    reason, text = "stream_stalled", (f"no data for {self.progress_timeout_s:g} s")
                else:
                    continue
                watch.expired = reason
                cancel_with_status(watch.context, grpc.StatusCode.DEADLINE_EXCEEDED, text)

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=2.0)


class StreamSlots:
    """At most one stream per key (a directed edge) at a time, and at most ``limit`` in all.

    ``limit`` is kept below the server's thread count, so the threads beyond it are always
    there for health checks and for refusing more streams at once.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._keys: set[str] = set()
        self._anonymous = 0

    def _count(self) -> int:
        return len(self._keys) + self._anonymous

    def acquire(self, key: str | None) -> str | None:
        """Take a slot for ``key`` (None: not known yet); the reason if none is free."""
        with self._lock:
            if key is not None and key in self._keys:
                return "busy_edge"
            if self._count() >= self.limit:
                return "too_many_streams"
            if key is None:
                self._anonymous += 1
            else:
                self._keys.add(key)
            return None

    def rekey(self, key: str) -> str | None:
        """Turn an anonymous slot into ``key``'s (once the header names the sender); the
        reason if ``key`` already has one (the anonymous slot is kept: release(None))."""
        with self._lock:
            if key in self._keys:
                return "busy_edge"
            self._anonymous -= 1
            self._keys.add(key)
            return None

    def release(self, key: str | None) -> None:
        with self._lock:
            if key is None:
                self._anonymous -= 1
            else:
                self._keys.discard(key)

    def in_use(self) -> int:
        with self._lock:
            return self._count()


def _identity(data: bytes) -> bytes:
    return data


def raw_unary(
    behaviour: Callable[[bytes, grpc.ServicerContext], Any],
    serializer: Callable[[Any], bytes],
) -> grpc.RpcMethodHandler:
    """A unary-unary handler that gets the request's raw bytes."""
    return grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=_identity, response_serializer=serializer
    )


def raw_unary_stream(
    behaviour: Callable[[bytes, grpc.ServicerContext], Iterator[Any]],
    serializer: Callable[[Any], bytes],
) -> grpc.RpcMethodHandler:
    """A unary-stream handler that gets the request's raw bytes."""
    return grpc.unary_stream_rpc_method_handler(
        behaviour, request_deserializer=_identity, response_serializer=serializer
    )


def raw_stream_unary(
    behaviour: Callable[[Iterator[bytes], grpc.ServicerContext], Any],
    serializer: Callable[[Any], bytes],
) -> grpc.RpcMethodHandler:
    """A stream-unary handler whose request iterator yields raw bytes."""
    return grpc.stream_unary_rpc_method_handler(
        behaviour, request_deserializer=_identity, response_serializer=serializer
    )


class RefusalCounts:
    """Refused calls by (method, reason): plain counts a metrics collector reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}

    def add(self, method: str, reason: str) -> None:
        with self._lock:
            key = (method, reason)
            self._counts[key] = self._counts.get(key, 0) + 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


def parsed_service(
    service: ServiceDescriptor,
    servicer: object,
    on_undecodable: Callable[[str], None],
) -> grpc.GenericRpcHandler:
    """Serve every method of ``service`` from raw bytes: each request is parsed here and
    passed to ``servicer.<Method>(request, context)`` as gRPC's generated code would.

    A request that does not parse is refused (``INVALID_ARGUMENT``) after
    ``on_undecodable(method)``. Only unary and server-streaming methods (what a control plane
    has); a client-streaming method raises ``ValueError`` here.
    """
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        if method.client_streaming:
            raise ValueError(f"{method.full_name}: client streams are not parsed here")
        request_type = message_factory.GetMessageClass(method.input_type)
        reply_type = message_factory.GetMessageClass(method.output_type)
        behaviour = getattr(servicer, method.name)

        def parsed(
            data: bytes,
            context: grpc.ServicerContext,
            name: str = method.name,
            request_type: Any = request_type,
            behaviour: Callable[[Any, grpc.ServicerContext], Any] = behaviour,
        ) -> Any:
            try:
                request = request_type.FromString(data)
            except (DecodeError, ValueError):
                on_undecodable(name)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a valid {name} request")
            return behaviour(request, context)

        wrap = raw_unary_stream if method.server_streaming else raw_unary
        handlers[method.name] = wrap(parsed, reply_type.SerializeToString)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


class HealthService:
    """The standard gRPC health service (``grpc.health.v1.Health``), ``Check`` only.

    ``Watch`` is not served (``UNIMPLEMENTED``): each watch would hold a server thread for as
    long as its client likes. Requests are parsed from raw bytes (see the module docstring).
    """

    NAME = "grpc.health.v1.Health"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._status: dict[str, int] = {}
        self._closing = False

    def set(self, service: str, status: int) -> None:
        with self._lock:
            if not self._closing:
                self._status[service] = status

    def enter_graceful_shutdown(self) -> None:
        with self._lock:
            self._closing = True
            for service in self._status:
                self._status[service] = health_pb2.HealthCheckResponse.NOT_SERVING

    def _check(self, data: bytes, context: grpc.ServicerContext) -> health_pb2.HealthCheckResponse:
        try:
            request = health_pb2.HealthCheckRequest.FromString(data)
        except (DecodeError, ValueError):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not a HealthCheckRequest")
        with self._lock:
            status = self._status.get(request.service)
        if status is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service[:100]!r}")
        return health_pb2.HealthCheckResponse(status=status)

    def handler(self) -> grpc.GenericRpcHandler:
        serialize = health_pb2.HealthCheckResponse.SerializeToString
        return grpc.method_handlers_generic_handler(
            self.NAME, {"Check": raw_unary(self._check, serialize)}
        )
