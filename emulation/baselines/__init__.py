"""Baselines: the same app run by another system, written as our results.

``flower``: Flower's own simulation engine running a Flower app with its own ServerApp
(FedAvg, for a quickstart app), on the same partitions as a serverless run of the app.
"""

from airgossip.emulation.baselines.flower import BaselineError, FlowerBaseline, run_flower_baseline

__all__ = ["BaselineError", "FlowerBaseline", "run_flower_baseline"]
