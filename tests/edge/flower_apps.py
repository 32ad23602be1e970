"""Small Flower apps for the adapter's tests: one that records what it is given, and ones
that fail in each way an app can (module:attr targets of ``--flower-app``)."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from sklearn.datasets import load_digits

SHAPES = {"w": (3, 2), "b": (2,)}


def initial_arrays() -> ArrayRecord:
    record = ArrayRecord()
    for name, shape in SHAPES.items():
        record[name] = Array(np.random.standard_normal(shape).astype(np.float32))
    return record


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    FedAvg(fraction_evaluate=1.0).start(
        grid=grid,
        initial_arrays=initial_arrays(),
        train_config=ConfigRecord({"lr": 0.5}),
        num_rounds=3,
    )


def _step(msg: Message) -> ArrayRecord:
    out = ArrayRecord()
    for name, array in msg.content["arrays"].items():
        out[name] = Array(array.numpy() + np.float32(1.0))
    return out


recording = ClientApp()


@recording.train()
def record_train(msg: Message, context: Context) -> Message:
    # What the app was given, kept in its persistent state for the test to read.
    calls = context.state.config_records.get("seen", ConfigRecord({"calls": 0}))["calls"]
    context.state["seen"] = ConfigRecord({
        "partition-id": context.node_config["partition-id"],
        "num-partitions": context.node_config["num-partitions"],
        "server-round": msg.content["config"]["server-round"],
        "lr": msg.content["config"]["lr"],
        "scale": context.run_config["scale"],
        "calls": int(calls) + 1,
        "message-type": msg.metadata.message_type,
    })  # fmt: skip
    metrics = MetricRecord({"train_loss": 0.25, "num-examples": 10})
    return Message(RecordDict({"arrays": _step(msg), "metrics": metrics}), reply_to=msg)


@recording.evaluate()
def record_evaluate(msg: Message, context: Context) -> Message:
    total = sum(float(a.numpy().sum()) for a in msg.content["arrays"].values())
    metrics = MetricRecord({"eval_acc": 0.5, "eval_loss": total, "f1": 0.75, "num-examples": 7})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


# Flower's own local DP on the train handler (as Flower's docs attach it: a mod of the whole
# app would also see evaluate replies, which carry no arrays, and refuse them): clips each
# update to 0.5 and adds Gaussian noise.
local_dp = ClientApp()


@local_dp.train(mods=[LocalDpMod(clipping_norm=0.5, sensitivity=0.5, epsilon=1000.0, delta=1e-5)])
def local_dp_train(msg: Message, context: Context) -> Message:
    metrics = MetricRecord({"train_loss": 0.5, "num-examples": 10})
    return Message(RecordDict({"arrays": _step(msg), "metrics": metrics}), reply_to=msg)


@local_dp.evaluate()
def local_dp_evaluate(msg: Message, context: Context) -> Message:
    metrics = MetricRecord({"eval_acc": 0.5, "num-examples": 7})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


def _broken(make_reply):  # type: ignore[no-untyped-def]
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return make_reply(msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"eval_acc": 0.1})}), reply_to=msg)

    return app


def _raise(msg: Message) -> Message:
    raise RuntimeError("out of memory on the device")


def _no_arrays(msg: Message) -> Message:
    return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)


def _reshaped(msg: Message) -> Message:
    out = _step(msg)
    out["w"] = Array(np.zeros((2, 3), dtype=np.float32))
    return Message(RecordDict({"arrays": out}), reply_to=msg)


def _float64(msg: Message) -> Message:
    out = _step(msg)
    out["b"] = Array(np.zeros(2, dtype=np.float64))
    return Message(RecordDict({"arrays": out}), reply_to=msg)


raises = _broken(_raise)
no_arrays = _broken(_no_arrays)
wrong_shape = _broken(_reshaped)
wrong_dtype = _broken(_float64)


needs_five = ServerApp()


@needs_five.main()
def main_five(grid: Grid, context: Context) -> None:
    FedAvg(min_available_nodes=5).start(grid=grid, initial_arrays=initial_arrays(), num_rounds=1)


# A bare Message API ClientApp, as a user writes one by hand: no ServerApp, no project
# folder; its query handler gives the initial model (an MLP on scikit-learn's digits).
bare_digits = ClientApp()


def _digits_net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def _digits_partition(context: Context) -> tuple[torch.Tensor, ...]:
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(3).permutation(len(y))
    part = np.array_split(order, int(context.node_config["num-partitions"]))[
        int(context.node_config["partition-id"])
    ]
    cut = int(0.8 * len(part))
    xs, ys = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
    return xs[part[:cut]], ys[part[:cut]], xs[part[cut:]], ys[part[cut:]]


def _digits_model(msg: Message) -> torch.nn.Module:
    net = _digits_net()
    net.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    return net


@bare_digits.query()
def bare_initial_model(msg: Message, context: Context) -> Message:
    content = RecordDict({"arrays": ArrayRecord(_digits_net().state_dict()),
                          "config": ConfigRecord({"lr": 0.1})})  # fmt: skip
    return Message(content, reply_to=msg)


@bare_digits.train()
def bare_train(msg: Message, context: Context) -> Message:
    net = _digits_model(msg)
    x, y, _, _ = _digits_partition(context)
    lr = float(str(msg.content.config_records["config"]["lr"]))
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    for batch in torch.randperm(len(y)).split(32):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
    metrics = MetricRecord({"train_loss": loss.item(), "num-examples": len(y)})
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics})
    return Message(content, reply_to=msg)


@bare_digits.evaluate()
def bare_evaluate(msg: Message, context: Context) -> Message:
    net = _digits_model(msg)
    _, _, x, y = _digits_partition(context)
    with torch.no_grad():
        logits = net(x)
    accuracy = float((logits.argmax(1) == y).float().mean())
    metrics = MetricRecord({"accuracy": accuracy, "num-examples": len(y)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
