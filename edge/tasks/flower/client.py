"""One node's ClientApp, called as Flower's runtime calls it.

Flower's SuperNode (and its simulation engine) builds a :class:`~flwr.app.Message` from the
server, calls ``client_app(message, context)`` with the node's persistent
:class:`~flwr.app.Context`, and hands the reply back; :class:`ClientRunner` does exactly
that, in-process. What a message holds follows what Flower's strategies send: ``arrays`` and
``config`` (with ``server-round``) for apps written with ``@app.train()`` /
``@app.evaluate()``, and the legacy ``fitins`` / ``evaluateins`` records, built by Flower's
own converters, for ``ClientApp(client_fn=...)`` apps. Every way an app can fail (it raises, replies
with an error, returns no arrays or arrays unlike the model's) becomes one
:class:`~airgossip.edge.tasks.flower.app.FlowerAppError` naming the app, the agent and what was
wrong.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict
from flwr.app.constants import DEFAULT_TTL
from flwr.app.message.message import make_message
from flwr.app.typing import MetricRecordValues
from flwr.clientapp import ClientApp
from flwr.common import (
    Code,
    Config,
    EvaluateIns,
    FitIns,
    GetParametersIns,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.constant import (
    NUM_PARTITIONS_KEY,
    PARTITION_ID_KEY,
    SUPERLINK_NODE_ID,
    MessageTypeLegacy,
)
from flwr.compat.common.recorddict_compat import (
    evaluateins_to_recorddict,
    fitins_to_recorddict,
    getparametersins_to_recorddict,
    recorddict_to_evaluateres,
    recorddict_to_fitres,
    recorddict_to_getparametersres,
)

from airgossip.edge.tasks.flower.app import FlowerAppError, RoundConfig, RunConfigValue
from airgossip.edge.tasks.flower.records import ModelLayout, record_arrays

#: The key under which Flower's strategies put the round in a message's config.
SERVER_ROUND = "server-round"
#: The key under which Flower apps report how many examples a reply stands for.
NUM_EXAMPLES = "num-examples"
#: The query a bare Message API ClientApp (no ServerApp) is asked for its initial model:
#: ``@app.query("initial_model")`` if it has one, else its default ``@app.query()``.
INITIAL_MODEL_QUERIES = ("query.initial_model", "query")


class RepeatOnce(logging.Filter):
    """Lets each distinct record through once: Flower warns on every call of a legacy app
    (``NumPyClient`` returned by ``client_fn``), which would bury an agent's log."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.levelno, record.getMessage())
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


_flower_log = logging.getLogger("flwr")
if not any(isinstance(f, RepeatOnce) for f in _flower_log.filters):
    _flower_log.addFilter(RepeatOnce())


def is_legacy(app: ClientApp) -> bool:
    """Whether ``app`` was built as ``ClientApp(client_fn=...)`` (Flower's own test: the
    legacy wrapper is set and no handler is registered)."""
    return getattr(app, "_call", None) is not None


@dataclass(frozen=True)
class TrainReply:
    names: list[str]
    arrays: list[np.ndarray]
    metrics: dict[str, float]
    num_examples: int


@dataclass(frozen=True)
class EvaluateReply:
    metrics: dict[str, float]
    num_examples: int


def _scalars(values: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and k != NUM_EXAMPLES
    }


def _num_examples(values: Mapping[str, Any]) -> int:
    value = values.get(NUM_EXAMPLES, 0)
    return int(value) if isinstance(value, int | float) else 0


class ClientRunner:
    """One node's ClientApp and its persistent Context.

    Parameters
    ----------
    app:
        The ``ClientApp``.
    spec:
        How the user named the app (for errors).
    agent:
        The agent's id (for errors).
    context:
        The node's Context: ``node_config`` with ``partition-id`` and ``num-partitions``,
        the run config, and ``state``, which persists across calls.
    """

    def __init__(self, app: ClientApp, spec: str, agent: str, context: Context) -> None:
        self.app = app
        self.spec = spec
        self.agent = agent
        self.context = context
        self.legacy = is_legacy(app)
        self._run_config = dict(context.run_config)

    @classmethod
    def for_partition(
        cls,
        app: ClientApp,
        spec: str,
        agent: str,
        *,
        run_id: int,
        node_id: int,
        partition: int,
        partitions: int,
        run_config: Mapping[str, RunConfigValue],
    ) -> ClientRunner:
        context = Context(
            run_id=run_id,
            node_id=node_id,
            node_config={PARTITION_ID_KEY: partition, NUM_PARTITIONS_KEY: partitions},
            state=RecordDict(),
            run_config=dict(run_config),
        )
        return cls(app, spec, agent, context)

    def fail(self, what: str) -> FlowerAppError:
        return FlowerAppError(f"flower app '{self.spec}' on {self.agent}: {what}")

    def legacy_config(self, config: RoundConfig) -> Config:
        """``config`` as a legacy app's ``FitIns``/``EvaluateIns`` carry it: scalars only."""
        scalars: Config = {}
        for key, value in config.items():
            if isinstance(value, list):
                raise self.fail(f"its config's '{key}' is a list; a legacy app takes scalars")
            scalars[key] = value
        return scalars

    def call(self, message_type: str, content: RecordDict, server_round: int) -> RecordDict:
        """Hand one message to the app; its reply's content (errors raised as one line)."""
        metadata = Metadata(
            run_id=self.context.run_id,
            message_id=uuid.uuid4().hex,
            src_node_id=SUPERLINK_NODE_ID,
            dst_node_id=self.context.node_id,
            reply_to_message_id="",
            group_id=str(server_round),
            created_at=time.time(),
            ttl=DEFAULT_TTL,
            message_type=message_type,
        )
        what = message_type.replace("_", " ")
        try:
            reply = self.app(make_message(metadata, content), self.context)
        except Exception as err:  # the user's code may raise anything
            detail = " ".join(str(err).split()) or "(no message)"
            raise self.fail(f"its {what} handler raised {type(err).__name__}: {detail}") from None
        if not isinstance(reply, Message):
            raise self.fail(f"its {what} handler returned {type(reply).__name__}, not a Message")
        if reply.has_error():
            raise self.fail(f"its {what} reply is an error: {reply.error.reason}")
        if not reply.has_content():
            raise self.fail(f"its {what} reply has no content")
        # Flower's runtime refuses a ClientApp that changed its run config.
        if self.context.run_config != self._run_config:
            raise self.fail(f"its {what} handler changed context.run_config (read-only in Flower)")
        return reply.content

    # -- the two styles of app -----------------------------------------------------------
    def train(
        self,
        layout: ModelLayout,
        arrays: ArrayRecord | list[np.ndarray],
        config: RoundConfig,
        server_round: int,
        keys: tuple[str, str],
    ) -> TrainReply:
        """The app's train step from ``arrays``; its arrays are checked against ``layout``."""
        config = {**config, SERVER_ROUND: server_round}
        if self.legacy:
            assert isinstance(arrays, list)
            ins = FitIns(ndarrays_to_parameters(arrays), self.legacy_config(config))
            content = self.call("train", fitins_to_recorddict(ins, keep_input=True), server_round)
            if "fitres.parameters" not in content.array_records:
                raise self.fail("its train reply holds no arrays")
            try:
                res = recorddict_to_fitres(content, keep_input=False)
                ndarrays = parameters_to_ndarrays(res.parameters)
            except Exception as err:
                raise self.fail(f"its train reply cannot be read: {err}") from None
            if res.status.code != Code.OK:
                raise self.fail(f"its train reply has status {res.status.code.name}: "
                                f"{res.status.message}")  # fmt: skip
            names = [str(i) for i in range(len(ndarrays))]
            metrics, examples = _scalars(res.metrics), res.num_examples
        else:
            assert isinstance(arrays, ArrayRecord)
            arrays_key, config_key = keys
            content = self.call(
                "train",
                RecordDict({arrays_key: arrays, config_key: ConfigRecord(dict(config))}),
                server_round,
            )
            records = list(content.array_records.values())
            if not records:
                raise self.fail("its train reply holds no arrays (no ArrayRecord)")
            if len(records) > 1:
                raise self.fail(
                    "its train reply holds several ArrayRecords "
                    f"({', '.join(content.array_records)}); Flower's strategies take one"
                )
            names, ndarrays = record_arrays(records[0])
            values: dict[str, MetricRecordValues] = {}
            for record in content.metric_records.values():
                values.update(record)
            metrics, examples = _scalars(values), _num_examples(values)
        if not ndarrays:
            raise self.fail("its train reply holds no arrays")
        problem = layout.mismatch(names, ndarrays)
        if problem is not None:
            raise self.fail(f"its train reply holds {problem}")
        return TrainReply(names, ndarrays, metrics, examples)

    def evaluate(
        self,
        arrays: ArrayRecord | list[np.ndarray],
        config: RoundConfig,
        server_round: int,
        keys: tuple[str, str],
    ) -> EvaluateReply:
        """The app's evaluation of ``arrays``: every scalar metric it reports (a legacy
        app's loss under ``loss``)."""
        config = {**config, SERVER_ROUND: server_round}
        if self.legacy:
            assert isinstance(arrays, list)
            ins = EvaluateIns(ndarrays_to_parameters(arrays), self.legacy_config(config))
            content = self.call(
                "evaluate", evaluateins_to_recorddict(ins, keep_input=True), server_round
            )
            try:
                res = recorddict_to_evaluateres(content)
            except Exception as err:
                raise self.fail(f"its evaluate reply cannot be read: {err}") from None
            if res.status.code != Code.OK:
                raise self.fail(f"its evaluate reply has status {res.status.code.name}: "
                                f"{res.status.message}")  # fmt: skip
            return EvaluateReply({**_scalars(res.metrics), "loss": res.loss}, res.num_examples)
        assert isinstance(arrays, ArrayRecord)
        arrays_key, config_key = keys
        content = self.call(
            "evaluate",
            RecordDict({arrays_key: arrays, config_key: ConfigRecord(dict(config))}),
            server_round,
        )
        values: dict[str, MetricRecordValues] = {}
        for record in content.metric_records.values():
            values.update(record)
        return EvaluateReply(_scalars(values), _num_examples(values))

    def get_parameters(self) -> list[np.ndarray]:
        """A legacy app's own initial parameters (what Flower's legacy server asks one
        client for when its strategy has none)."""
        content = self.call(
            MessageTypeLegacy.GET_PARAMETERS,
            getparametersins_to_recorddict(GetParametersIns(config={})),
            0,
        )
        try:
            res = recorddict_to_getparametersres(content, keep_input=False)
            return parameters_to_ndarrays(res.parameters)
        except Exception as err:
            raise self.fail(f"its get_parameters reply cannot be read: {err}") from None

    def query_initial_model(self) -> tuple[str, list[str], list[np.ndarray], RoundConfig]:
        """A bare Message API app's own initial model, asked with a query message (see
        :data:`INITIAL_MODEL_QUERIES`): the one ArrayRecord of its reply (key, names,
        arrays), and the reply's ConfigRecord (the config of every round; empty if none).
        """
        registered = getattr(self.app, "_registered_funcs", {})
        message_type = next(
            (t for t in INITIAL_MODEL_QUERIES if (t if "." in t else f"{t}.default") in registered),
            None,
        )
        if message_type is None:
            raise FlowerAppError(
                f"flower app '{self.spec}' is a Message API ClientApp with no ServerApp and no "
                "query handler to take the initial model from: give --server-app module:attr "
                "(or the app's project folder), or register @app.query() replying with the "
                "model's ArrayRecord"
            )
        content = self.call(message_type, RecordDict({"config": ConfigRecord({})}), 0)
        records = content.array_records
        if len(records) != 1:
            raise self.fail(
                f"its {message_type} reply holds {len(records)} ArrayRecords; the initial "
                "model is one"
            )
        key, record = next(iter(records.items()))
        names, arrays = record_arrays(record)
        config: RoundConfig = {}
        for values in content.config_records.values():
            config.update(values)
        return key, names, arrays, config
