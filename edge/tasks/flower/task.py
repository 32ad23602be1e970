"""``flower``: an unchanged Flower ClientApp as an agent's task.

Each agent is one Flower node: ``context.node_config`` holds its ``partition-id`` (the
agent's index) and ``num-partitions`` (the fleet size), ``context.run_config`` the app's run
config with the run's overrides, and ``context.state`` persists from call to call. A local
step is one train message holding the agent's current estimate and the config of the round;
the arrays the app returns become the step (the agent moves by their difference to what it
handed over). An evaluation is one evaluate message; the metric the app reports as
accuracy (``accuracy`` or ``eval_acc`` unless named) and as loss (``loss`` or
``eval_loss``) become the round's ``accuracy`` and ``loss``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import ArrayRecord
from pydantic import BaseModel, ConfigDict, Field

from airgossip.common.identity import agent_id
from airgossip.common.seeds import derive_seed
from airgossip.edge.tasks.base import EvalResult, TaskContext, TrainConfig, TrainResult
from airgossip.edge.tasks.flower.app import (
    FlowerAppError,
    RoundConfig,
    RunConfigValue,
    load_flower_app,
)
from airgossip.edge.tasks.flower.client import ClientRunner
from airgossip.edge.tasks.flower.initial import initial_model
from airgossip.edge.tasks.flower.records import ModelLayout
from airgossip.edge.tasks.options import parse_options

#: Names a Flower app reports its test accuracy and loss under, tried in this order.
ACCURACY_NAMES = ("accuracy", "eval_acc")
LOSS_NAMES = ("loss", "eval_loss")

_ID_BITS = (1 << 63) - 1


class FlowerOptions(BaseModel):
    """``[task]`` options of ``name = "flower"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    app: str = Field(description="a Flower app project folder, or module:attr of a ClientApp")
    run_config: dict[str, RunConfigValue] = Field(
        default_factory=dict, description="overrides of the app's run config"
    )
    server_app: str | None = Field(
        None, description="module:attr of the ServerApp (default: the project's own)"
    )
    accuracy_metric: str | None = Field(
        None, description="the app's accuracy metric (default: accuracy, else eval_acc)"
    )
    loss_metric: str | None = Field(
        None, description="the app's loss metric (default: loss, else eval_loss)"
    )


def evaluation_metrics(
    reported: Mapping[str, float],
    *,
    accuracy_metric: str | None,
    loss_metric: str | None,
    where: str,
) -> dict[str, float]:
    """An app's evaluate metrics with its accuracy and loss renamed ``accuracy`` and
    ``loss`` (the rest kept as they are).

    Raises
    ------
    FlowerAppError
        A metric named explicitly is not among those reported.
    """
    out = dict(reported)
    for target, explicit, defaults in (
        ("accuracy", accuracy_metric, ACCURACY_NAMES),
        ("loss", loss_metric, LOSS_NAMES),
    ):
        if explicit is not None and explicit not in reported:
            raise FlowerAppError(
                f"{where}: its evaluate reply has no metric '{explicit}' "
                f"(it reports: {', '.join(reported) or 'none'}); "
                f"name the {target} metric with --{target}-metric"
            )
        name = explicit or next((n for n in defaults if n in reported), None)
        if name is not None:
            out.pop(name)
            out[target] = reported[name]
    return out


def flower_run_id(seed: int) -> int:
    """The run id every agent's Context shares (Flower's are random 64-bit numbers)."""
    return derive_seed(seed, "flower-run") & _ID_BITS


def flower_node_id(seed: int, index: int) -> int:
    """Agent ``index``'s node id in Flower's Context."""
    return derive_seed(seed, "flower-node", index) & _ID_BITS


class FlowerTask:
    """A Flower ClientApp trained and evaluated through Flower's Message contract."""

    name = "flower"
    shared_initialisation = True
    gossip_dtype = torch.float32

    def __init__(self, context: TaskContext) -> None:
        self.options = parse_options(FlowerOptions, context.options, self.name)
        self.agent = agent_id(context.agent_index)
        run_config: dict[str, RunConfigValue] = dict(self.options.run_config)
        self.app = load_flower_app(self.options.app, run_config, server_app=self.options.server_app)
        self.client = ClientRunner.for_partition(
            self.app.client_app(),
            self.app.spec,
            self.agent,
            run_id=flower_run_id(context.seed),
            node_id=flower_node_id(context.seed, context.agent_index),
            partition=context.agent_index,
            partitions=context.num_agents,
            run_config=self.app.run_config,
        )
        start = initial_model(self.app, self.client, num_nodes=context.num_agents,
                              seed=context.seed)  # fmt: skip
        self.layout = ModelLayout.of(start.names, start.arrays)
        problem = self.layout.mismatch(start.names, start.arrays)
        if problem is not None:
            raise FlowerAppError(f"{start.source} gives {problem}")
        self.source = start.source
        self._start = start
        self._initial = self.layout.flatten(start.arrays)
        self._round = 0

    def initial_parameters(self) -> torch.Tensor:
        return self._initial.clone()

    def _arrays(self, parameters: torch.Tensor) -> ArrayRecord | list[np.ndarray]:
        if self.client.legacy:
            return self.layout.unflatten(parameters)
        return self.layout.array_record(parameters)

    def _config(self, extra: RoundConfig) -> RoundConfig:
        return {**self.app.run_config, **extra}

    def train(self, parameters: torch.Tensor, config: TrainConfig) -> TrainResult:
        self._round = config.round
        reply = self.client.train(
            self.layout,
            self._arrays(parameters),
            self._config(self._start.train_config(config.round)),
            config.round,
            self._start.keys,
        )
        metrics = {
            (k if k.startswith("train") else f"train_{k}"): v for k, v in reply.metrics.items()
        }
        return TrainResult(self.layout.flatten(reply.arrays), metrics, reply.num_examples)

    def evaluate(self, parameters: torch.Tensor) -> EvalResult:
        reply = self.client.evaluate(
            self._arrays(parameters),
            self._config(self._start.evaluate_config(self._round)),
            self._round,
            self._start.keys,
        )
        metrics = evaluation_metrics(
            reply.metrics,
            accuracy_metric=self.options.accuracy_metric,
            loss_metric=self.options.loss_metric,
            where=f"flower app '{self.app.spec}' on {self.agent}",
        )
        return EvalResult(metrics, reply.num_examples)
