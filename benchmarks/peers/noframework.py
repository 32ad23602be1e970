"""The shared task with no framework: the same arithmetic in one process.

Eight models train one local epoch each per round on their shards, then take the exact
average of the eight (what a perfect all-reduce gives); the round's accuracy is the
average model's on the test set. No sockets, no serialization: the floor every framework
is measured against.

    python noframework.py SPLIT.npz EVENTS.jsonl ROUNDS
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plain


def main() -> None:
    split_path, events_path, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    split = plain.load_split(split_path)
    agents = split["agents"]
    net = plain.model(split["hidden"])
    average = plain.flat(net)
    generators = [torch.Generator().manual_seed(1000 + i) for i in range(agents)]
    x_test, y_test = split["test"]
    events = plain.Events(events_path)
    for round_index in range(1, rounds + 1):
        trained = []
        for i, (x, y) in enumerate(split["shards"]):
            plain.load(net, average)
            optimizer = torch.optim.SGD(
                net.parameters(), lr=split["lr"], momentum=split["momentum"]
            )
            plain.train_epoch(net, optimizer, x, y, split["batch_size"], generators[i])
            trained.append(plain.flat(net))
        average = torch.stack(trained).mean(dim=0)
        plain.load(net, average)
        acc = plain.accuracy(net, x_test, y_test)
        for i in range(agents):
            events.write(i, round_index, acc)


if __name__ == "__main__":
    main()
