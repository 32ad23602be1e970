"""Flower apps as tasks: an unchanged Flower ``ClientApp`` trains and evaluates for an agent.

Flower's runtime hands a ``ClientApp`` a :class:`~flwr.app.Message` and a
:class:`~flwr.app.Context` and reads the arrays and metrics of its reply; an agent does the
same, in-process, once per local step and once per evaluation. The ServerApp has no place
in a serverless run: gossip replaces its aggregation, and it is asked only for the model it
would broadcast first (see :mod:`airgossip.edge.tasks.flower.initial`).
"""

from airgossip.edge.tasks.flower.app import FlowerApp, FlowerAppError, load_flower_app
from airgossip.edge.tasks.flower.task import FlowerOptions, FlowerTask

__all__ = ["FlowerApp", "FlowerAppError", "FlowerOptions", "FlowerTask", "load_flower_app"]
