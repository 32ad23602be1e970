"""A package's public names loaded on first use (PEP 562).

``airgossip.edge.algorithms``, ``airgossip.edge.compression``, ``airgossip.edge.tasks`` and
``airgossip.common.topology`` name what they export and the module that defines each; importing the
package imports none of them, so a check that needs one torch-free module (a codec's grammar, what
an algorithm asks of its graph) runs before torch is imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: each name in ``homes`` from its module."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home), name)

    return __getattr__
