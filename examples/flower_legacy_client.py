"""A Flower app in the legacy style: ``ClientApp(client_fn=...)`` returning a ``NumPyClient``.

Written as Flower 1.x apps were before the Message API (an MLP on scikit-learn's digits, so
nothing is downloaded); it runs peer-to-peer unchanged::

    airgossip run --flower-app examples.flower_legacy_client:app --agents 4 --rounds 20

With no ServerApp, every agent starts from the client's own ``get_parameters`` (what
Flower's legacy server asks one client for when its strategy has no initial parameters).
"""

from collections import OrderedDict

import numpy as np
import torch
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context
from sklearn.datasets import load_digits
from torch import nn


def make_net() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def load_partition(partition_id: int, num_partitions: int):
    """This partition's (x_train, y_train, x_test, y_test), split 80/20."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(7).permutation(len(y))
    part = np.array_split(order, num_partitions)[partition_id]
    cut = int(0.8 * len(part))
    xs = torch.tensor(x / 16.0, dtype=torch.float32)
    ys = torch.tensor(y)
    return xs[part[:cut]], ys[part[:cut]], xs[part[cut:]], ys[part[cut:]]


class DigitsClient(NumPyClient):
    def __init__(self, partition_id: int, num_partitions: int, lr: float, epochs: int) -> None:
        self.net = make_net()
        self.x_train, self.y_train, self.x_test, self.y_test = load_partition(
            partition_id, num_partitions
        )
        self.lr, self.epochs = lr, epochs

    def get_parameters(self, config):
        return [v.cpu().numpy() for v in self.net.state_dict().values()]

    def set_parameters(self, parameters):
        keys = self.net.state_dict().keys()
        self.net.load_state_dict(
            OrderedDict((k, torch.tensor(v)) for k, v in zip(keys, parameters, strict=True))
        )

    def fit(self, parameters, config):
        self.set_parameters(parameters)
        optimizer = torch.optim.SGD(self.net.parameters(), lr=self.lr, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        self.net.train()
        for _ in range(self.epochs):
            for batch in torch.randperm(len(self.y_train)).split(32):
                optimizer.zero_grad()
                loss = loss_fn(self.net(self.x_train[batch]), self.y_train[batch])
                loss.backward()
                optimizer.step()
        return self.get_parameters({}), len(self.y_train), {"train_loss": loss.item()}

    def evaluate(self, parameters, config):
        self.set_parameters(parameters)
        self.net.eval()
        with torch.no_grad():
            logits = self.net(self.x_test)
            loss = float(nn.functional.cross_entropy(logits, self.y_test))
            accuracy = float((logits.argmax(1) == self.y_test).float().mean())
        return loss, len(self.y_test), {"accuracy": accuracy}


def client_fn(context: Context):
    return DigitsClient(
        partition_id=int(context.node_config["partition-id"]),
        num_partitions=int(context.node_config["num-partitions"]),
        lr=float(context.run_config.get("lr", 0.1)),
        epochs=int(context.run_config.get("local-epochs", 1)),
    ).to_client()


app = ClientApp(client_fn=client_fn)
