"""Registries of plugins by name that list their names without importing the plugins.

A plugin (an algorithm, a task, a fleet mode) is a class or function in its own module, which
may import torch. Its registry line names it and says where it lives (``module:attribute``)
and, for help texts, what it is in one line; the plugin is imported the first time it is
looked up. So the names, what ``--help`` and every early settings check need, cost nothing,
and adding a plugin is its module and one line.

A registry is a mapping: iterating it, ``len`` and ``in`` see the names only, indexing loads
(and checks that the plugin declares the name it is registered under, where it declares one).
Tests and users register loaded plugins with ``registry[name] = plugin``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    target: str
    summary: str
    loaded: T | None = None


class PluginRegistry(MutableMapping[str, T]):
    """Plugins of one kind by name, loaded on first look-up.

    Parameters
    ----------
    kind:
        What the plugins are, in error messages (``algorithm``, ``mode``).
    lines:
        Name to ``module:attribute``, or to ``(module:attribute, one-line summary)``, in the
        order help texts list them.
    declares:
        The attribute a loaded plugin declares its own name in (``name``, ``mode``); None:
        plugins declare none.
    """

    def __init__(
        self,
        kind: str,
        lines: Mapping[str, str | tuple[str, str]],
        *,
        declares: str | None = "name",
    ) -> None:
        self.kind = kind
        self.declares = declares
        self._entries: dict[str, _Entry[T]] = {}
        for name, line in lines.items():
            target, summary = (line, "") if isinstance(line, str) else line
            if ":" not in target:
                raise ValueError(f"{kind} '{name}': '{target}' is not module:attribute")
            self._entries[name] = _Entry(target, summary)

    def __getitem__(self, name: str) -> T:
        entry = self._entries[name]
        if entry.loaded is None:
            module, _, attribute = entry.target.partition(":")
            plugin = getattr(importlib.import_module(module), attribute)
            declared = getattr(plugin, self.declares, name) if self.declares else name
            if declared != name:
                raise LookupError(
                    f"{self.kind} '{name}' is registered as {entry.target}, which declares "
                    f"'{declared}'"
                )
            entry.loaded = plugin
        return entry.loaded

    def __setitem__(self, name: str, plugin: T) -> None:
        summary = getattr(plugin, "summary", "")
        target = f"{getattr(plugin, '__module__', '?')}:{getattr(plugin, '__qualname__', '?')}"
        self._entries[name] = _Entry(target, summary if isinstance(summary, str) else "", plugin)

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def summary(self, name: str) -> str:
        """The one line the registry says of ``name`` (empty where it says none)."""
        return self._entries[name].summary

    def target(self, name: str) -> str:
        """Where ``name`` lives: ``module:attribute``."""
        return self._entries[name].target

    def unknown(self, name: str) -> str:
        """The one-line error for a name not registered."""
        return f"unknown {self.kind} '{name}'; choose one of: {', '.join(self)}"

    def get_plugin(self, name: str) -> T:
        """The plugin ``name``; ``ValueError`` (:meth:`unknown`) if none is registered."""
        if name not in self._entries:
            raise ValueError(self.unknown(name))
        return self[name]
