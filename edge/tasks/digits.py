"""``digits``: an MLP on scikit-learn's bundled 8x8 handwritten digits.

The data ships inside scikit-learn's wheel (1,797 images); it is read straight from the
package's CSV so an agent does not pay for importing scikit-learn. A held-out test split is
the same on every agent; the rest is split across agents IID or by a Dirichlet(alpha) draw
over classes (smaller alpha: more skewed), or, with ``samples_per_agent``, each agent holds
that many images drawn at random from it (shards overlap: a fleet larger than the data set).
"""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from airgossip.edge.tasks.base import (
    EvalResult,
    PrivateTraining,
    TaskContext,
    TaskError,
    TrainConfig,
    TrainResult,
    load_flat,
)
from airgossip.edge.tasks.options import parse_options

#: The step size of a ``[privacy]`` run whose ``[task]`` sets no ``lr``: a private round is
#: one clipped, noisy step on the whole shard, where the task's own training takes
#: ``local_steps`` small ones, so the default ``lr`` (0.2, for those) leaves a private run
#: near 0.4; 4 with the task's own decay was the best measured of 0.2, 2 (no decay) and 4
#: for every mechanism at epsilon 3 and 8 (docs/privacy.md, *The private step size*).
PRIVATE_LR = 4.0


class DigitsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: Literal["iid", "dirichlet"] = "iid"
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration (non-IID skew)")
    samples_per_agent: int | None = Field(
        None,
        ge=1,
        description="each agent holds this many training images drawn at random (IID) from "
        "the training pool, so shards overlap; unset: the pool is split, disjoint",
    )
    hidden: int = Field(32, ge=1, le=65536)
    local_steps: int = Field(10, ge=1)
    local_epochs: int | None = Field(
        None,
        ge=1,
        description="passes over the shard per round in shuffled minibatches (replaces "
        "local_steps' batches drawn with replacement)",
    )
    batch_size: int = Field(16, ge=1)
    lr: float = Field(
        0.2, gt=0, description=f"step size (a [privacy] run's default: {PRIVATE_LR:g})"
    )
    momentum: float = Field(0.0, ge=0, lt=1)
    lr_decay_at: float = Field(0.75, gt=0, le=1, description="fraction of rounds where lr /= 10")
    test_fraction: float = Field(0.2, gt=0, lt=1)
    init: Literal["shared", "independent"] = Field(
        "shared", description="every agent starts from the same model, or from its own"
    )
    distill_steps: int = Field(20, ge=1, description="SGD steps of one distillation")
    distill_weight: float = Field(
        0.5, ge=0, le=1, description="share of the distillation loss on the ensemble's outputs"
    )

    @model_validator(mode="after")
    def _sampled_shards_are_iid(self) -> DigitsOptions:
        if self.samples_per_agent is not None and self.partition != "iid":
            raise ValueError(
                "samples_per_agent draws IID shards; it cannot be combined with partition "
                f"'{self.partition}' (use partition = 'iid', or leave samples_per_agent unset)"
            )
        return self


@lru_cache(maxsize=1)
def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` of scikit-learn's digits: X float32 in [0, 1] of shape (1797, 64)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise TaskError("task 'digits' needs scikit-learn installed (its data ships with it)")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if not path.exists():
        raise TaskError(f"task 'digits': scikit-learn's data file is missing at {path}")
    with gzip.open(path, "rt") as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.float32)
    return table[:, :-1] / 16.0, table[:, -1].astype(np.int64)


def _held_out(
    labels: np.ndarray, seed: int, options: DigitsOptions
) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
    """Held-out test indices, the training pool, and the generator that drew them."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    n_test = round(len(labels) * options.test_fraction)
    return order[:n_test], order[n_test:], rng


def sampled_shard(
    train: np.ndarray, seed: int, agent_index: int, options: DigitsOptions
) -> np.ndarray:
    """Agent ``agent_index``'s ``samples_per_agent`` images, drawn without replacement from
    the training pool by a generator of its own (the fleet seed and its index): an agent
    draws its shard without drawing everyone else's."""
    size = options.samples_per_agent
    if size is None:
        raise ValueError("sampled_shard needs samples_per_agent set")
    if size > len(train):
        raise TaskError(
            f"task 'digits': samples_per_agent = {size} exceeds the {len(train)} training "
            "images (lower it, or lower test_fraction)"
        )
    rng = np.random.default_rng([seed, agent_index, 1])
    return np.sort(rng.choice(train, size, replace=False))


def split_indices(
    labels: np.ndarray, num_agents: int, seed: int, options: DigitsOptions
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Held-out test indices and one train shard per agent."""
    test, train, rng = _held_out(labels, seed, options)
    if options.samples_per_agent is not None:
        return test, [sampled_shard(train, seed, i, options) for i in range(num_agents)]
    if len(train) < num_agents:
        raise TaskError(
            f"task 'digits': {len(train)} training images cannot feed {num_agents} agents"
        )
    if options.partition == "iid":
        return test, [np.sort(s) for s in np.array_split(train, num_agents)]
    classes = np.unique(labels)
    for _ in range(100):
        shards: list[list[int]] = [[] for _ in range(num_agents)]
        for c in classes:
            members = train[labels[train] == c]
            share = rng.dirichlet(np.full(num_agents, options.alpha))
            cuts = (np.cumsum(share)[:-1] * len(members)).astype(int)
            for agent, part in enumerate(np.split(members, cuts)):
                shards[agent].extend(part.tolist())
        if min(len(s) for s in shards) >= 2:
            return test, [np.sort(np.asarray(s, dtype=np.int64)) for s in shards]
    raise TaskError(
        f"task 'digits': Dirichlet(alpha={options.alpha}) left an agent without data in 100 draws; "
        "raise alpha or use fewer agents"
    )


def _mlp(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


class DigitsTask:
    """MLP 64-hidden-10 trained with minibatch SGD on this agent's shard.

    With ``init = "independent"`` every agent draws its own initial model (from the fleet
    seed and its index): parameter averaging then destroys accuracy, and ensemble
    compression (:meth:`distill`) is the way to combine the models.
    """

    name = "digits"
    gossip_dtype = torch.float32
    #: Options a ``[privacy]`` run uses where ``[task]`` sets none (resolved once per run,
    #: with the run's settings: ``airgossip.scenario.config.load_config``).
    private_defaults: ClassVar[Mapping[str, float]] = {"lr": PRIVATE_LR}

    def __init__(self, context: TaskContext) -> None:
        self.options = parse_options(DigitsOptions, context.options, self.name)
        self.device = context.device
        x, y = load_digits_arrays()
        if self.options.samples_per_agent is None:
            test, shards = split_indices(y, context.num_agents, context.seed, self.options)
            own = shards[context.agent_index]
            self._nominal_examples = (len(y) - len(test)) / context.num_agents
        else:  # one draw of its own, not the whole fleet's on every agent
            test, train, _ = _held_out(y, context.seed, self.options)
            own = sampled_shard(train, context.seed, context.agent_index, self.options)
            self._nominal_examples = float(len(own))
        self.num_train = len(own)
        self._x_train = torch.from_numpy(x[own]).to(self.device)
        self._y_train = torch.from_numpy(y[own]).to(self.device)
        self._x_test = torch.from_numpy(x[test]).to(self.device)
        self._y_test = torch.from_numpy(y[test]).to(self.device)
        self.shared_initialisation = self.options.init == "shared"
        init_seed = context.seed
        if not self.shared_initialisation:
            init_seed = int(
                np.random.default_rng([context.seed, context.agent_index]).integers(2**62)
            )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            self.model = _mlp(self.options.hidden)
        self.model.to(self.device)
        self._initial = nn.utils.parameters_to_vector(self.model.parameters()).detach().cpu()
        self._batches = torch.Generator().manual_seed(
            context.seed * 1_000_003 + context.agent_index
        )
        self._loss = nn.CrossEntropyLoss()

    def initial_parameters(self) -> torch.Tensor:
        return self._initial.clone()

    def _load(self, parameters: torch.Tensor) -> None:
        load_flat(self.model, parameters)

    def _lr(self, config: TrainConfig) -> float:
        opts = self.options
        decay = config.round >= opts.lr_decay_at * config.total_rounds and opts.lr_decay_at < 1
        return opts.lr * (0.1 if decay else 1.0)

    def _batches_of_round(self) -> list[torch.Tensor]:
        """This round's minibatches: ``local_steps`` drawn with replacement, or
        ``local_epochs`` shuffled passes over the shard (the last batch of a pass smaller)."""
        opts = self.options
        if opts.local_epochs is None:
            return [
                torch.randint(0, self.num_train, (opts.batch_size,), generator=self._batches)
                for _ in range(opts.local_steps)
            ]
        batches: list[torch.Tensor] = []
        for _ in range(opts.local_epochs):
            order = torch.randperm(self.num_train, generator=self._batches)
            batches.extend(torch.split(order, opts.batch_size))
        return batches

    def _sgd(
        self, batches: Sequence[torch.Tensor], lr: float, loss_of: Callable[[torch.Tensor], Any]
    ) -> float:
        """One minibatch SGD step per batch of indices on ``loss_of(batch)``; the mean loss."""
        opts = self.options
        params = list(self.model.parameters())
        # Plain SGD by hand: torch.optim's first use imports torch._dynamo (~2 s per process).
        velocity = [torch.zeros_like(p) for p in params] if opts.momentum else []
        self.model.train()
        total = 0.0
        for indices in batches:
            batch = indices.to(self.device)
            for p in params:
                p.grad = None
            loss = loss_of(batch)
            loss.backward()
            with torch.no_grad():
                for i, p in enumerate(params):
                    step = p.grad
                    if step is None:
                        continue
                    if velocity:
                        step = velocity[i].mul_(opts.momentum).add_(step)
                    p.add_(step, alpha=-lr)
            total += float(loss.detach())
        return total / len(batches)

    def train(self, parameters: torch.Tensor, config: TrainConfig) -> TrainResult:
        self._load(parameters)
        lr = self._lr(config)
        x, y = self._x_train, self._y_train
        batches = self._batches_of_round()
        loss = self._sgd(batches, lr, lambda b: self._loss(self.model(x[b]), y[b]))
        new = nn.utils.parameters_to_vector(self.model.parameters()).detach().cpu()
        examples = sum(len(b) for b in batches)
        return TrainResult(new, {"train_loss": loss, "lr": lr}, examples)

    def private_training(self, parameters: torch.Tensor, config: TrainConfig) -> PrivateTraining:
        """The model from ``parameters``, this agent's shard and a per-example cross-entropy,
        for a privacy mechanism's steps (``[privacy]``; it replaces :meth:`train`)."""
        self._load(parameters)
        return PrivateTraining(
            model=self.model,
            features=self._x_train,
            labels=self._y_train,
            loss=nn.CrossEntropyLoss(reduction="none"),
            lr=self._lr(config),
            nominal_examples=self._nominal_examples,
        )

    @torch.no_grad()
    def _ensemble_probabilities(
        self, teachers: Sequence[torch.Tensor], x: torch.Tensor
    ) -> torch.Tensor:
        """The averaged softmax outputs of ``teachers`` (flat parameter vectors) on ``x``."""
        self.model.eval()
        total = torch.zeros(len(x), 10, device=self.device)
        for teacher in teachers:
            self._load(teacher)
            total += torch.softmax(self.model(x), dim=1)
        return total / len(teachers)

    def distill(
        self, parameters: torch.Tensor, teachers: Sequence[torch.Tensor], config: TrainConfig
    ) -> TrainResult:
        """Ensemble compression (EC-DNN): SGD on this agent's shard towards the ensemble's
        averaged outputs (share ``distill_weight`` of the loss, cross-entropy to the soft
        targets) and the labels (the rest)."""
        if not teachers:
            raise ValueError("distillation needs at least one teacher model")
        opts = self.options
        x, y = self._x_train, self._y_train
        targets = self._ensemble_probabilities(teachers, x)
        self._load(parameters)
        weight = opts.distill_weight

        def loss_of(batch: torch.Tensor) -> Any:
            logits = self.model(x[batch])
            soft = -(targets[batch] * torch.log_softmax(logits, dim=1)).sum(dim=1).mean()
            return weight * soft + (1 - weight) * self._loss(logits, y[batch])

        batches = [
            torch.randint(0, self.num_train, (opts.batch_size,), generator=self._batches)
            for _ in range(opts.distill_steps)
        ]
        loss = self._sgd(batches, self._lr(config), loss_of)
        new = nn.utils.parameters_to_vector(self.model.parameters()).detach().cpu()
        metrics = {"distill_loss": loss, "teachers": float(len(teachers))}
        return TrainResult(new, metrics, opts.distill_steps * opts.batch_size)

    def evaluate_ensemble(self, members: Sequence[torch.Tensor]) -> EvalResult:
        """Test accuracy and loss of the output ensemble of ``members`` (averaged softmax)."""
        probabilities = self._ensemble_probabilities(members, self._x_test)
        loss = float(nn.functional.nll_loss(torch.log(probabilities + 1e-12), self._y_test))
        accuracy = float((probabilities.argmax(dim=1) == self._y_test).float().mean())
        return EvalResult({"accuracy": accuracy, "loss": loss}, len(self._y_test))

    @torch.no_grad()
    def evaluate(self, parameters: torch.Tensor) -> EvalResult:
        self._load(parameters)
        self.model.eval()
        logits = self.model(self._x_test)
        loss = float(self._loss(logits, self._y_test))
        accuracy = float((logits.argmax(dim=1) == self._y_test).float().mean())
        return EvalResult({"accuracy": accuracy, "loss": loss}, len(self._y_test))
