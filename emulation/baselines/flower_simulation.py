"""The Flower baseline's own process: Flower's simulation engine running an app with its own
ServerApp, watched through the grid the engine hands it.

Run by :func:`airgossip.emulation.baselines.flower.run_flower_baseline` as
``python -m airgossip.emulation.baselines.flower_simulation JOB.json`` in a process group of its
own, so that Ray and everything it starts go away with it. This is what Flower's
``flwr-simulation`` process runs once a SuperLink has handed it an app
(``flwr.simulation.run_simulation._run_simulation`` with the app's folder, its ServerApp
and ClientApp and the fused run config), minus the SuperLink: nothing listens on a port,
nothing is installed, and no Flower process outlives the run.

The ServerApp gets a :class:`MeteredGrid`: every message it sends and every reply it gets
is counted in bytes (Flower's own serialized form) and every evaluate reply's metrics are
kept, one line per round in ``rounds.jsonl``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.compat.common.recorddict_compat import recorddict_to_evaluateres
from flwr.serverapp import Grid, ServerApp
from flwr.simulation.run_simulation import _run_simulation
from flwr.supercore.constant import NOOP_FEDERATION_ID
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.supercore.telemetry import EventType

from airgossip.common.security.private_files import open_private
from airgossip.edge.tasks.flower import FlowerAppError, load_flower_app
from airgossip.edge.tasks.flower.client import SERVER_ROUND
from airgossip.edge.tasks.flower.initial import seeded
from airgossip.edge.tasks.flower.task import evaluation_metrics, flower_run_id
from airgossip.emulation.baselines.job import FlowerJob, FlowerRound


def message_bytes(message: Message) -> int:
    """Bytes of a message in the form Flower moves it (every serialized object of it:
    the message, its record dict, records and array chunks), gRPC framing aside."""
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(message).values())


def _round_of(message: Message) -> int:
    group = message.metadata.group_id
    if group.isdigit():
        return int(group)
    if message.has_content():
        for record in message.content.config_records.values():
            value = record.get(SERVER_ROUND)
            if isinstance(value, int):
                return value
    return 0


@dataclass
class _Round:
    accuracies: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    failed: int = 0
    wall_s: float = 0.0
    bytes_sent: int = 0
    messages_sent: int = 0
    reason: str = ""


class Recorder:
    """Counts what crosses the grid and writes one JSON line per evaluated round."""

    def __init__(self, path: Path, job: FlowerJob) -> None:
        self.path = path
        self.job = job
        self.started = time.monotonic()
        self.bytes_sent = 0
        self.messages_sent = 0
        self.messages_failed = 0
        self.rounds: dict[int, _Round] = {}
        self.sent_round = 0
        self.written = 0
        self._lock = threading.Lock()

    def sent(self, messages: list[Message]) -> None:
        sizes: dict[int, int] = {}
        with self._lock:
            for message in messages:
                key = id(message.content) if message.has_content() else id(message)
                if key not in sizes:
                    sizes[key] = message_bytes(message)
                self.bytes_sent += sizes[key]
                self.messages_sent += 1
                if message.metadata.message_type.startswith("train"):
                    self.sent_round = max(self.sent_round, _round_of(message))
            self._flush(before=self.sent_round)

    def replied(self, sent: dict[str, Message], replies: Iterable[Message]) -> None:
        with self._lock:
            for reply in replies:
                self.bytes_sent += message_bytes(reply)
                self.messages_sent += 1
                request = sent.get(reply.metadata.reply_to_message_id)
                if request is None or not request.metadata.message_type.startswith("evaluate"):
                    if reply.has_error():
                        self.messages_failed += 1
                    continue
                row = self.rounds.setdefault(_round_of(request), _Round())
                if reply.has_error():
                    self.messages_failed += 1
                    row.failed += 1
                    row.reason = row.reason or str(reply.error.reason)
                else:
                    self._evaluated(row, reply)
                row.wall_s = time.monotonic() - self.started
                row.bytes_sent, row.messages_sent = self.bytes_sent, self.messages_sent

    def _evaluated(self, row: _Round, reply: Message) -> None:
        content = reply.content
        if "evaluateres.loss" in content.metric_records:
            res = recorddict_to_evaluateres(content)  # a legacy strategy's EvaluateRes
            values: dict[str, float] = {**_scalars(res.metrics), "loss": res.loss}
        else:
            values = {}
            for record in content.metric_records.values():
                values.update(_scalars(record))
        metrics = evaluation_metrics(
            values,
            accuracy_metric=self.job.accuracy_metric,
            loss_metric=self.job.loss_metric,
            where=f"flower app '{self.job.app}'",
        )
        if "accuracy" in metrics:
            row.accuracies.append(metrics["accuracy"])
        if "loss" in metrics:
            row.losses.append(metrics["loss"])

    def _flush(self, before: int | None = None) -> None:
        done = sorted(r for r in self.rounds if before is None or r < before)
        with open_private(self.path, "a") as handle:
            for number in done:
                row = self.rounds.pop(number)
                if row.failed and not (row.accuracies or row.losses):
                    raise FlowerAppError(
                        f"flower app '{self.job.app}': every evaluate reply of round "
                        f"{number} is an error: {row.reason}"
                    )
                line = FlowerRound(round=number, **row.__dict__).model_dump_json()
                handle.write(line + "\n")
                self.written += 1

    def close(self) -> None:
        with self._lock:
            self._flush()


def _scalars(values: Any) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


class MeteredGrid(Grid):
    """The engine's grid, every message through it counted by a :class:`Recorder`."""

    def __init__(self, inner: Grid, recorder: Recorder) -> None:
        self.inner = inner
        self.recorder = recorder
        self._sent: dict[str, Message] = {}

    def set_run(self, run: Run) -> None:
        self.inner.set_run(run)

    @property
    def run(self) -> Run:
        return self.inner.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return self.inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.inner.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        batch = list(messages)
        self.recorder.sent(batch)
        ids = list(self.inner.push_messages(batch))
        for message in batch:
            self._sent[message.metadata.message_id] = message
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = list(self.inner.pull_messages(message_ids))
        self.recorder.replied(self._sent, replies)
        return replies

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        batch = list(messages)
        self.recorder.sent(batch)
        # The engine assigns message ids as it pushes; the replies name them.
        replies = list(self.inner.send_and_receive(batch, timeout=timeout))
        sent = {m.metadata.message_id: m for m in batch}
        self.recorder.replied(sent, replies)
        return replies


def run(job: FlowerJob, out_dir: Path) -> None:
    """Run the job's app on Flower's simulation engine, its rounds to ``out_dir``."""
    app = load_flower_app(job.app, job.run_config)
    server = app.server_app()
    if server is None or app.project_dir is None:
        raise FlowerAppError(f"flower app '{app.spec}' has no ServerApp to run")
    recorder = Recorder(out_dir / "rounds.jsonl", job)

    metered = ServerApp()

    @metered.main()
    def main(grid: Grid, context: Context) -> None:
        recorder.started = time.monotonic()
        with seeded(job.seed):  # the same initial model as the serverless run's
            server(grid=MeteredGrid(grid, recorder), context=context)

    run_id = flower_run_id(job.seed)
    flower_run = Run.create_empty(run_id=run_id)
    flower_run.primary_task_id = 1
    flower_run.federation_id = NOOP_FEDERATION_ID
    flower_run.override_config = dict(job.run_config)
    # What flwr-simulation sets before it starts a run.
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    context = Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(),
                      run_config=dict(app.run_config))  # fmt: skip
    _run_simulation(
        num_supernodes=job.agents,
        exit_event=EventType.FLWR_SIMULATION_RUN_LEAVE,
        server_app=metered,
        client_app_attr=app.client_ref,
        backend_name="ray",
        backend_config={
            "client_resources": {"num_cpus": job.client_cpus, "num_gpus": 0.0},
            "init_args": {"_temp_dir": job.ray_dir, "include_dashboard": False},
        },
        app_dir=str(app.project_dir),
        run=flower_run,
        server_app_context=context,
        is_app=True,
    )
    recorder.close()
    if recorder.written == 0:
        raise FlowerAppError(
            f"flower app '{app.spec}': its ServerApp evaluated no round on the ClientApps "
            "(the baseline reads accuracy from their evaluate replies)"
        )


def main() -> int:
    job_path = Path(sys.argv[1])
    job = FlowerJob.read(job_path)
    from flwr.supercore.app_utils import start_parent_process_monitor

    start_parent_process_monitor(job.parent_pid)
    logging.getLogger("flwr").setLevel(logging.INFO)
    try:
        run(job, job_path.parent)
    except FlowerAppError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 1
    except Exception as err:
        traceback.print_exc()
        cause = err.__cause__ or err
        detail = " ".join(str(cause).split())
        print(f"error: Flower's simulation failed: {type(cause).__name__}: {detail}",
              file=sys.stderr, flush=True)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    sys.exit(main())
