"""p2pfl 0.4.4 on the shared task: eight nodes, each trains one local epoch per round, then
FedAvg over gRPC on a ring (p2pfl's own workflow: vote the train set, train, gossip the
partial aggregates, finish the round).

The nodes run in one process, as p2pfl's own examples run them (each node its own gRPC
server on 127.0.0.1). torchvision is not installed (its wheel does not load beside the CPU
torch); an empty module stands in for the one import p2pfl's learner makes of it. Ray is
off (``Settings.general.DISABLE_RAY``); the heartbeat and gossip settings are p2pfl's
``set_standalone_settings``. Runs inside p2pfl's own virtual environment::

    python p2pfl_peers.py SPLIT.npz EVENTS.jsonl ROUNDS

p2pfl evaluates a node's model at the start of each round it trains in (the aggregate of
the rounds before) and once after the last round; each evaluation is one events line.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plain


def main() -> None:
    split_path, events_path, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    from p2pfl.settings import Settings

    # Before anything imports p2pfl's logger, which starts a Ray instance on import otherwise.
    Settings.general.DISABLE_RAY = True
    import lightning as L

    # p2pfl's learner imports torchvision.datasets for its MNIST helper (not used here), and
    # PyPI's torchvision does not load beside the CPU torch: an empty module stands in, put
    # in place only now, after lightning and torchmetrics looked for a real one.
    stub = types.ModuleType("torchvision")
    stub.datasets = types.ModuleType("torchvision.datasets")  # type: ignore[attr-defined]
    sys.modules.update({"torchvision": stub, "torchvision.datasets": stub.datasets})
    # Eight Lightning trainers in threads of one process share rich's one live display and
    # crash tearing it down ("pop from empty list"): plain progress bars instead.
    from lightning.pytorch.trainer.connectors import callback_connector

    callback_connector._RICH_AVAILABLE = False  # type: ignore[attr-defined]
    from datasets import Dataset, DatasetDict
    from p2pfl.learning.dataset.p2pfl_dataset import P2PFLDataset
    from p2pfl.learning.frameworks.pytorch.lightning_model import LightningModel
    from p2pfl.node import Node
    from p2pfl.utils.topologies import TopologyFactory, TopologyType
    from p2pfl.utils.utils import set_standalone_settings, wait_convergence, wait_to_finish

    set_standalone_settings()
    Settings.general.LOG_DIR = str(Path(events_path).parent / "p2pfl-logs")
    split = plain.load_split(split_path)
    agents = split["agents"]

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = plain.model(split["hidden"])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=split["lr"], momentum=split["momentum"])

        def training_step(self, batch: dict[str, torch.Tensor], _: int) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(self(batch["image"].float()), batch["label"])

        def test_step(self, batch: dict[str, torch.Tensor], _: int) -> torch.Tensor:
            logits = self(batch["image"].float())
            acc = (logits.argmax(dim=1) == batch["label"]).float().mean()
            self.log("test_accuracy", acc, batch_size=len(batch["label"]))
            return acc

    x_test, y_test = split["test"]
    test = Dataset.from_dict({"image": x_test.numpy(), "label": y_test.numpy()})
    events = plain.Events(events_path)
    nodes = []
    for i, (x, y) in enumerate(split["shards"]):
        train = Dataset.from_dict({"image": x.numpy(), "label": y.numpy()})
        data = P2PFLDataset(
            DatasetDict({"train": train, "test": test}), batch_size=split["batch_size"]
        )
        node = Node(LightningModel(MLP()), data, addr="127.0.0.1")
        node.start()
        learner, original = node.learner, node.learner.evaluate

        def evaluate(original=original, node=node, i=i):
            results = original()
            if "test_accuracy" in results and node.state.round:
                events.write(i, node.state.round, float(results["test_accuracy"]))
            return results

        learner.evaluate = evaluate
        nodes.append(node)
    try:
        matrix = TopologyFactory.generate_matrix(TopologyType.RING, agents)
        TopologyFactory.connect_nodes(matrix, nodes)
        wait_convergence(nodes, agents - 1, only_direct=False, wait=60)
        nodes[0].set_start_learning(rounds=rounds, epochs=1, trainset_size=agents)
        wait_to_finish(nodes, timeout=3600)
    finally:
        for node in nodes:
            node.stop()


if __name__ == "__main__":
    main()
