"""hivemind 1.1.12 on the shared task: eight peers, each trains one local epoch per round and
then averages its model with the others through a ``DecentralizedAverager`` (all-reduce in
groups found over hivemind's DHT).

Runs inside hivemind's own virtual environment (our package is not importable there)::

    python hivemind_peers.py SPLIT.npz EVENTS.jsonl ROUNDS

Peer 0 starts the DHT; the others join through its address. Every peer appends one events
line per round (see ``plain.py``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plain

GROUP_PREFIX = "airgossip-bench"


def peer(index: int, split_path: str, events_path: str, rounds: int, maddr_file: str) -> None:
    import hivemind

    torch.set_num_threads(1)
    split = plain.load_split(split_path)
    agents = split["agents"]
    if index == 0:
        dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        maddrs = [str(a) for a in dht.get_visible_maddrs()]
        Path(maddr_file + ".tmp").write_text("\n".join(maddrs))
        Path(maddr_file + ".tmp").rename(maddr_file)
    else:
        while not Path(maddr_file).exists():
            time.sleep(0.05)
        initial = Path(maddr_file).read_text().split()
        dht = hivemind.DHT(start=True, initial_peers=initial, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    net = plain.model(split["hidden"])
    averager = hivemind.averaging.DecentralizedAverager(
        [plain.flat(net)],
        dht,
        start=True,
        prefix=GROUP_PREFIX,
        target_group_size=agents,
        min_group_size=2,
        min_matchmaking_time=1.0,
        request_timeout=0.5,
    )
    x, y = split["shards"][index]
    x_test, y_test = split["test"]
    generator = torch.Generator().manual_seed(1000 + index)
    events = plain.Events(events_path)
    for round_index in range(1, rounds + 1):
        optimizer = torch.optim.SGD(net.parameters(), lr=split["lr"], momentum=split["momentum"])
        plain.train_epoch(net, optimizer, x, y, split["batch_size"], generator)
        with averager.get_tensors() as tensors:
            tensors[0].copy_(plain.flat(net))
        group = averager.step(timeout=30.0)
        with averager.get_tensors() as tensors:
            plain.load(net, tensors[0].clone())
        size = len(group) if group else 1
        events.write(index, round_index, plain.accuracy(net, x_test, y_test), group=size)
    # Stay a moment so that slower peers' last all-reduce finds its group.
    time.sleep(2.0)
    averager.shutdown()
    dht.shutdown()


def main() -> None:
    if sys.argv[1] == "peer":
        peer(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
        return
    split_path, events_path, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    agents = plain.load_split(split_path)["agents"]
    maddr_file = str(Path(events_path).with_suffix(".maddrs"))
    Path(maddr_file).unlink(missing_ok=True)
    command = [sys.executable, __file__, "peer"]
    tail = [split_path, events_path, str(rounds), maddr_file]
    procs = [subprocess.Popen([*command, str(i), *tail]) for i in range(agents)]
    codes = [p.wait() for p in procs]
    sys.exit(max(codes))


if __name__ == "__main__":
    main()
