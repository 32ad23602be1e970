"""What an algorithm's checkpointed state may hold, and typed reads of its parts.

:meth:`~airgossip.edge.algorithms.base.GossipAlgorithm.state_dict` returns an
:data:`AlgorithmState`; :meth:`~airgossip.edge.algorithms.base.GossipAlgorithm.load_state_dict`
reads it back with the ``state_*`` functions, which refuse a part of the wrong kind with a
``TypeError`` (a checkpoint that does not fit is refused, never half taken up).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

import torch

#: A value a checkpoint can hold (what :func:`~airgossip.edge.agent.checkpoints.encode_state`
#: writes): a tensor, bytes, a number, a string, None, or lists and string-keyed tables of
#: these, at any depth. A tuple reads back as a list.
StateValue: TypeAlias = (
    torch.Tensor | bytes | bool | int | float | str
    | list["StateValue"] | tuple["StateValue", ...] | dict[str, "StateValue"] | None
)  # fmt: skip
#: An algorithm's own checkpointed state (:meth:`GossipAlgorithm.state_dict`): named parts.
AlgorithmState: TypeAlias = dict[str, StateValue]


def state_value(value: object, where: str = "state") -> StateValue:
    """``value`` as a :data:`StateValue` (tuples stay tuples, keys become strings);
    ``TypeError`` naming ``where`` if it holds anything a checkpoint cannot."""
    if value is None or isinstance(value, torch.Tensor | bytes | bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): state_value(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [state_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise TypeError(f"{where} is a {type(value).__name__}, which a checkpoint cannot hold")


def state_tensor(state: Mapping[str, StateValue], key: str) -> torch.Tensor:
    """The tensor ``state[key]``: ``KeyError`` if missing, ``TypeError`` if not a tensor."""
    value = state[key]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{key!r} is a {type(value).__name__}, not a tensor")
    return value


def state_float(state: Mapping[str, StateValue], key: str) -> float:
    """The number ``state[key]`` as a float: ``KeyError`` if missing, ``TypeError`` if not a
    number."""
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{key!r} is a {type(value).__name__}, not a number")
    return float(value)


def state_int(state: Mapping[str, StateValue], key: str) -> int:
    """The integer ``state[key]``: ``KeyError`` if missing, ``TypeError`` if not an int."""
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{key!r} is a {type(value).__name__}, not an integer")
    return value


def state_flag(state: Mapping[str, StateValue], key: str) -> bool:
    """The flag ``state[key]``: ``KeyError`` if missing, ``TypeError`` if not a bool."""
    value = state[key]
    if not isinstance(value, bool):
        raise TypeError(f"{key!r} is a {type(value).__name__}, not a flag")
    return value


def state_table(state: Mapping[str, StateValue], key: str) -> dict[str, StateValue]:
    """The table ``state[key]`` (an empty one if missing): ``TypeError`` if not a dict."""
    value = state.get(key, {})
    if not isinstance(value, dict):
        raise TypeError(f"{key!r} is a {type(value).__name__}, not a table")
    return value
