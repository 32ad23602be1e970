"""The shared task with torch alone: what every contender outside our package runs.

The peer frameworks' drivers run inside their own virtual environments, where our package
is not installed; they import only this module (torch and numpy). The data split comes from
a ``.npz`` file that the runner writes with our digits task's own split (IID shards of the
training images, one held-out test set), so every contender trains and tests on the same
images.

Each driver appends one JSON line per agent and round to its events file:
``{"t": unix time, "agent": i, "round": r, "accuracy": a}``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

TARGET_ACCURACY = 0.90


def load_split(path: str | Path) -> dict[str, Any]:
    """Shards and test set from the runner's ``.npz``: ``x_shard_i``, ``y_shard_i``, ..."""
    data = np.load(path)
    agents = int(data["agents"])
    return {
        "agents": agents,
        "hidden": int(data["hidden"]),
        "lr": float(data["lr"]),
        "momentum": float(data["momentum"]),
        "batch_size": int(data["batch_size"]),
        "shards": [
            (torch.from_numpy(data[f"x_shard_{i}"]), torch.from_numpy(data[f"y_shard_{i}"]))
            for i in range(agents)
        ],
        "test": (torch.from_numpy(data["x_test"]), torch.from_numpy(data["y_test"])),
    }


def model(hidden: int, seed: int = 0) -> nn.Module:
    """MLP 64-hidden-10, the same initialisation on every agent for one seed."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def train_epoch(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    generator: torch.Generator,
) -> float:
    """One pass over the shard in shuffled minibatches; the mean loss."""
    loss_fn = nn.CrossEntropyLoss()
    order = torch.randperm(len(y), generator=generator)
    total, batches = 0.0, 0
    net.train()
    for start in range(0, len(y), batch_size):
        batch = order[start : start + batch_size]
        optimizer.zero_grad()
        loss = loss_fn(net(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        total += loss.item()
        batches += 1
    return total / max(batches, 1)


@torch.no_grad()
def accuracy(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    net.eval()
    return float((net(x).argmax(dim=1) == y).float().mean())


def flat(net: nn.Module) -> torch.Tensor:
    return nn.utils.parameters_to_vector(net.parameters()).detach().clone()


def load(net: nn.Module, vector: torch.Tensor) -> None:
    """Copy ``vector`` into ``net``'s parameters. (``vector_to_parameters`` would make them
    views of ``vector``: training would then change the vector itself, and the next model
    loaded from it would start where this one ended.) The agents' own is
    ``airgossip.edge.tasks.base.load_flat``; this module runs in the peers' environments,
    where airgossip is not installed."""
    with torch.no_grad():
        offset = 0
        for parameter in net.parameters():
            size = parameter.numel()
            parameter.copy_(vector[offset : offset + size].view_as(parameter))
            offset += size


class Events:
    """Appends one JSON line per (agent, round) to ``path`` (flushed at once)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def write(self, agent: int, round_index: int, acc: float, **extra: Any) -> None:
        line = {"t": time.time(), "agent": agent, "round": round_index, "accuracy": acc, **extra}
        with self.path.open("a") as handle:
            handle.write(json.dumps(line) + "\n")
