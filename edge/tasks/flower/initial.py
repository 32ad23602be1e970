"""The model a Flower app starts from, taken from its own ServerApp.

In Flower the ServerApp creates the initial model and broadcasts it in the first round's
train messages. A serverless run has no server, but every agent must start from that same
model, so each agent asks the ServerApp for it: the ServerApp runs (under the fleet seed,
so every agent gets the same model) against a grid that answers with the fleet's nodes and
stops it at the first message it sends, whose arrays and config are what the strategy would
have broadcast. A legacy ServerApp (``server_fn`` with a legacy strategy) is asked as
Flower's legacy server asks it: ``strategy.initialize_parameters``, and, when that gives
nothing, the client's own ``get_parameters``. A ``module:attr`` ClientApp with no ServerApp
is asked itself: a legacy one for its ``get_parameters``, a Message API one with a query
message (its ``@app.query("initial_model")`` or ``@app.query()`` handler replies with the
model's ArrayRecord, and optionally a ConfigRecord: the config of every round).
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import Context, Message, RecordDict
from flwr.common import parameters_to_ndarrays
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.compat.common.recorddict_compat import arrayrecord_to_parameters
from flwr.server.client_manager import SimpleClientManager
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from airgossip.edge.tasks.flower.app import FlowerApp, FlowerAppError, RoundConfig
from airgossip.edge.tasks.flower.client import SERVER_ROUND, ClientRunner
from airgossip.edge.tasks.flower.records import record_arrays

#: Node-list requests a ServerApp may make before its first message: FedAvg asks twice,
#: and a strategy that wants more nodes than the fleet has asks again every second.
NODE_LIST_PATIENCE = 6

#: The strategy's config of a round (without ``server-round``).
ConfigFn = Callable[[int], RoundConfig]


def _no_config(server_round: int) -> RoundConfig:
    return {}


@dataclass(frozen=True)
class InitialModel:
    """What the ServerApp would have broadcast first.

    Attributes
    ----------
    names, arrays:
        The model's named arrays.
    source:
        Where they came from, for the agent's log.
    keys:
        Under which keys the strategy puts arrays and config in a message.
    train_config, evaluate_config:
        The strategy's config for a round (without ``server-round``).
    """

    names: list[str]
    arrays: list[np.ndarray]
    source: str
    keys: tuple[str, str] = ("arrays", "config")
    train_config: ConfigFn = field(default=_no_config)
    evaluate_config: ConfigFn = field(default=_no_config)


class _FirstMessages(BaseException):
    """Stops the ServerApp at its first send (a BaseException, so that an app's own
    ``except Exception`` cannot swallow it)."""

    def __init__(self, messages: Iterable[Message]) -> None:
        super().__init__()
        self.messages = list(messages)


class _TooFewNodes(BaseException):
    pass


class ProbeGrid(Grid):
    """A grid with the fleet's nodes that delivers nothing: the first messages the
    ServerApp sends end its run."""

    def __init__(self, run: Run, num_nodes: int) -> None:
        self._run = run
        self._nodes = list(range(SUPERLINK_NODE_ID + 1, SUPERLINK_NODE_ID + 1 + num_nodes))
        self.node_list_requests = 0

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        self.node_list_requests += 1
        if self.node_list_requests > NODE_LIST_PATIENCE:
            raise _TooFewNodes
        return list(self._nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise _FirstMessages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return []

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        raise _FirstMessages(messages)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Python's, numpy's and torch's global RNGs seeded with ``seed``, restored after."""
    py_state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


@contextlib.contextmanager
def quiet_flower() -> Iterator[None]:
    """Flower's INFO lines off: the ServerApp's start-up banner is not this run's."""
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def _from_message(message: Message, where: str) -> InitialModel:
    content = message.content
    if "fitins.parameters" in content.array_records:  # a legacy strategy's FitIns
        parameters = arrayrecord_to_parameters(
            content.array_records["fitins.parameters"], keep_input=True
        )
        arrays = parameters_to_ndarrays(parameters)
        config = dict(content.config_records.get("fitins.config", {}))
        config.pop(SERVER_ROUND, None)
        return InitialModel([str(i) for i in range(len(arrays))], arrays, where,
                            train_config=lambda r: dict(config))  # fmt: skip
    records = content.array_records
    if len(records) != 1:
        raise FlowerAppError(
            f"{where} holds {len(records)} ArrayRecords; one is needed to start every "
            "agent from the same model"
        )
    arrays_key, record = next(iter(records.items()))
    names, arrays = record_arrays(record)
    configs = content.config_records
    config_key = next(iter(configs), "config")
    captured = {k: v for k, v in configs.get(config_key, {}).items() if k != SERVER_ROUND}
    return InitialModel(
        names,
        arrays,
        where,
        keys=(arrays_key, config_key),
        train_config=lambda r: dict(captured),
        evaluate_config=lambda r: dict(captured),
    )


def _probe_server_app(
    app: FlowerApp, server: ServerApp, context: Context, num_nodes: int
) -> InitialModel:
    where = f"flower app '{app.spec}': ServerApp '{app.server_ref}'"
    grid = ProbeGrid(Run.create_empty(run_id=context.run_id), num_nodes)
    try:
        server(grid=grid, context=context)
    except _FirstMessages as sent:
        with_arrays = [m for m in sent.messages if m.has_content() and m.content.array_records]
        if not with_arrays:
            raise FlowerAppError(
                f"{where}: its first message carries no arrays to start the agents from"
            ) from None
        first = with_arrays[0]
        return _from_message(first, f"{where} (its first {first.metadata.message_type} message)")
    except _TooFewNodes:
        raise FlowerAppError(
            f"{where} waits for more nodes than the fleet's {num_nodes} agents "
            "(its strategy's min_available_nodes): run more agents"
        ) from None
    except Exception as err:
        raise FlowerAppError(
            f"{where} raised {type(err).__name__} before its first round: "
            f"{' '.join(str(err).split())}"
        ) from None
    raise FlowerAppError(f"{where} sent no message to take the initial model from")


def _legacy_strategy(
    app: FlowerApp, server: ServerApp, context: Context, client: ClientRunner
) -> InitialModel:
    where = f"flower app '{app.spec}': ServerApp '{app.server_ref}'"
    server_fn = getattr(server, "_server_fn", None)
    try:
        strategy: Any = server_fn(context).strategy if server_fn else server._strategy
        parameters = (
            strategy.initialize_parameters(client_manager=SimpleClientManager())
            if strategy is not None
            else None
        )
    except Exception as err:
        raise FlowerAppError(
            f"{where} raised {type(err).__name__}: {' '.join(str(err).split())}"
        ) from None
    fit_config: ConfigFn = getattr(strategy, "on_fit_config_fn", None) or _no_config
    evaluate_config: ConfigFn = getattr(strategy, "on_evaluate_config_fn", None) or _no_config
    if parameters is not None:
        arrays = parameters_to_ndarrays(parameters)
        source = f"{where} (its strategy's initial parameters)"
    else:
        arrays = client.get_parameters()
        source = f"flower app '{app.spec}': the client's get_parameters (strategy has none)"
    return InitialModel([str(i) for i in range(len(arrays))], arrays, source,
                        train_config=fit_config, evaluate_config=evaluate_config)  # fmt: skip


def _query_client(app: FlowerApp, client: ClientRunner) -> InitialModel:
    key, names, arrays, config = client.query_initial_model()
    config.pop(SERVER_ROUND, None)
    source = f"flower app '{app.spec}': the ClientApp's own query reply (no ServerApp)"
    return InitialModel(
        names, arrays, source, keys=(key, "config"),
        train_config=lambda r: dict(config), evaluate_config=lambda r: dict(config),
    )  # fmt: skip


def initial_model(
    app: FlowerApp, client: ClientRunner, *, num_nodes: int, seed: int
) -> InitialModel:
    """The model every agent starts from (the same on every agent for a seed).

    Raises
    ------
    FlowerAppError
        The app has no way to give one (a Message API ClientApp without a ServerApp or a
        query handler), or its ServerApp fails before its first round.
    """
    server = app.server_app()
    context = Context(
        run_id=client.context.run_id,
        node_id=0,
        node_config={},
        state=RecordDict(),
        run_config=dict(app.run_config),
    )
    # Messages built by a ServerApp take their run from Flower's process-wide identity,
    # which Flower's runtime sets before it starts one.
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = context.run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    with seeded(seed), quiet_flower():
        if server is not None and getattr(server, "_main", None) is not None:
            model = _probe_server_app(app, server, context, num_nodes)
        elif server is not None:
            model = _legacy_strategy(app, server, context, client)
        elif client.legacy:
            arrays = client.get_parameters()
            source = f"flower app '{app.spec}': the client's get_parameters (no ServerApp)"
            model = InitialModel([str(i) for i in range(len(arrays))], arrays, source)
        else:
            model = _query_client(app, client)
    if not model.arrays:
        raise FlowerAppError(f"{model.source} gave a model without arrays")
    if client.legacy and model.keys != ("arrays", "config"):
        raise FlowerAppError(f"{model.source}: a legacy ClientApp cannot take these messages")
    return model
