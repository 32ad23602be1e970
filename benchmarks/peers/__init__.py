"""The peer comparison: one task, run by our fleet, Flower, hivemind, p2pfl and no framework.

The task: 8 peers on one machine, scikit-learn's digits in IID shards, MLP 64-64-10, SGD
(lr 0.1, momentum 0.9, batch 32), one local epoch per round, until the mean test accuracy
over the peers reaches 0.90. Each contender is one command, run in a network namespace of
its own (root) so that its loopback carries its traffic and nobody else's, under a
process-tree watch (peak PSS, CPU seconds). Time to 0.90 is measured from the command's
launch to the moment the round whose mean accuracy first reached 0.90 was known for every
peer (records stamped as they appear, or by the peers themselves).

The frameworks we compare with are installed into virtual environments of their own
(:mod:`benchmarks.peers.venvs`), never into ours; their drivers (``hivemind_peers.py``,
``p2pfl_peers.py``) import only the framework and :mod:`benchmarks.peers.plain`.
"""
