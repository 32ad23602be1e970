"""The run's roster: which identities may take part in it.

A coordinator serves one run, and only the identities that run expects may register, or
call it at all: with mutual TLS an identity is the certificate's, so a certificate the
fleet's CA issued to someone else (another fleet's agent, a tool, a spare) cannot join, fix
the run's task digest or use up a slot. By default a run of N agents expects the ids its
launchers give (``agent-0`` .. ``agent-(N-1)``, :func:`airgossip.common.identity.agent_ids`);
``airgossip coordinator --roster`` names others (:meth:`Roster.parse`), and a coordinator
that takes any identity says so (``--roster any``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from airgossip.common.identity import AGENT_PREFIX, agent_ids, natural_order
from airgossip.coordinator.refusal import Refusal

#: What ``--roster`` takes to admit any identity.
ANY = "any"
#: Most ids a roster names (each is one string in memory, compared on every call).
MAX_ROSTER = 1 << 16
#: A range of agent indexes (``0..15``) or of ids with one prefix (``agent-0..agent-15``).
_RANGE = re.compile(r"(?P<prefix>[^.]*?)(?P<first>\d+)\.\.(?P=prefix)(?P<last>\d+)")
_INDEXES = re.compile(r"(?P<first>\d+)\.\.(?P<last>\d+)")
#: The ids a roster may name: those the servicer takes
#: (``airgossip.coordinator.servicer.AGENT_ID``).
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


@dataclass(frozen=True)
class Roster:
    """The identities a run admits (``ids`` None: any).

    Build one with :meth:`indexed`, :meth:`anyone`, :meth:`of` or :meth:`parse`.
    """

    ids: frozenset[str] | None

    @classmethod
    def indexed(cls, count: int) -> Roster:
        """The ids launchers give a fleet of ``count`` agents: ``agent-0`` ..
        ``agent-(count-1)``."""
        return cls(frozenset(agent_ids(count)))

    @classmethod
    def anyone(cls) -> Roster:
        """A roster that admits any identity (the CA, or the join token, is the only gate)."""
        return cls(None)

    @classmethod
    def of(cls, ids: Iterable[str]) -> Roster:
        """A roster of exactly ``ids`` (``ValueError`` for an id the coordinator would not
        take, or for none at all)."""
        named = frozenset(ids)
        if not named:
            raise ValueError("a roster names at least one agent id (or is 'any')")
        if len(named) > MAX_ROSTER:
            raise ValueError(f"a roster names at most {MAX_ROSTER} ids, got {len(named)}")
        for agent_id in named:
            if not _ID.fullmatch(agent_id):
                raise ValueError(
                    f"{agent_id[:64]!r} is not an agent id (1-128 letters, digits or "
                    "._:@- starting with a letter or digit)"
                )
        return cls(named)

    @classmethod
    def parse(cls, text: str) -> Roster:
        """A roster as ``airgossip coordinator --roster`` takes it.

        ``any`` admits any identity; ``@FILE`` reads the ids from a file (one or more a line,
        separated by commas or spaces; ``#`` starts a comment); otherwise a comma-separated
        list whose items are ids (``pi-kitchen``), index ranges (``0..15``: ``agent-0`` ..
        ``agent-15``) or id ranges (``node-4..node-7``).

        Raises
        ------
        ValueError
            Text that names no id, an id the coordinator would not take, a range that runs
            backwards, or a file that cannot be read (one line: what was wrong).
        """
        text = text.strip()
        if text == ANY:
            return cls.anyone()
        if text.startswith("@"):
            path = Path(text[1:])
            try:
                content = path.read_text(encoding="utf-8")
            except OSError as err:
                raise ValueError(f"roster file {path}: {err.strerror or err}") from None
            except UnicodeDecodeError:
                raise ValueError(f"roster file {path} is not UTF-8 text") from None
            lines = (line.split("#", 1)[0] for line in content.splitlines())
            items = [i for line in lines for i in re.split(r"[,\s]+", line) if i]
        else:
            items = [i.strip() for i in text.split(",") if i.strip()]
        ids: list[str] = []
        for item in items:
            ids += _expand(item)
            if len(ids) > MAX_ROSTER:
                raise ValueError(f"a roster names at most {MAX_ROSTER} ids")
        if not ids:
            raise ValueError(
                f"{text[:64]!r} names no agent id: give ids, ranges (0..15, "
                "agent-0..agent-15), @FILE or 'any'"
            )
        return cls.of(ids)

    @property
    def open(self) -> bool:
        """Whether any identity is admitted."""
        return self.ids is None

    @property
    def size(self) -> int | None:
        """How many ids it names (None: any)."""
        return None if self.ids is None else len(self.ids)

    def admits(self, agent_id: str) -> bool:
        """Whether ``agent_id`` is a member of the run."""
        return self.ids is None or agent_id in self.ids

    def check(self, agent_id: str) -> None:
        """:class:`Refusal` (``PERMISSION_DENIED``) for an identity that is not a member."""
        if not self.admits(agent_id):
            raise Refusal(
                "PERMISSION_DENIED",
                f"{agent_id[:64]!r} is not a member of this run (roster: {self.describe()}); "
                "the coordinator's --roster names the run's agents",
            )

    def check_fits(self, expected: int) -> None:
        """``ValueError`` when the roster names fewer agents than the run waits for (the
        fleet would never fill)."""
        if self.ids is not None and len(self.ids) < expected:
            raise ValueError(
                f"the roster names {len(self.ids)} agents ({self.describe()}); the run waits "
                f"for {expected}"
            )

    def describe(self, limit: int = 6) -> str:
        """The roster in a few words: runs of ``agent-<i>`` folded into ranges
        (``agent-0..agent-3, pi-kitchen``), at most ``limit`` parts, then a count."""
        if self.ids is None:
            return "any identity"
        indexes: list[int] = []
        others: list[str] = []
        for agent_id in self.ids:
            suffix = agent_id.removeprefix(AGENT_PREFIX)
            if suffix != agent_id and suffix.isdigit() and str(int(suffix)) == suffix:
                indexes.append(int(suffix))
            else:
                others.append(agent_id)
        parts: list[str] = []
        for first, last in _runs(sorted(indexes)):
            name = f"{AGENT_PREFIX}{first}"
            parts.append(name if first == last else f"{name}..{AGENT_PREFIX}{last}")
        parts += natural_order(others)
        if len(parts) > limit:
            return f"{', '.join(parts[:limit])}, ... ({len(self.ids)} ids)"
        return ", ".join(parts)


def _runs(values: list[int]) -> list[tuple[int, int]]:
    """Sorted integers as runs of consecutive ones (first, last)."""
    runs: list[tuple[int, int]] = []
    for value in values:
        if runs and value == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], value)
        else:
            runs.append((value, value))
    return runs


def _expand(item: str) -> list[str]:
    """One roster item: an id, an index range or an id range."""
    if ".." not in item:
        return [item]
    indexes = _INDEXES.fullmatch(item)
    named = indexes or _RANGE.fullmatch(item)
    if named is None:
        raise ValueError(
            f"{item[:64]!r} is not a range: write 0..15 (agent-0..agent-15) or "
            "PREFIX<first>..PREFIX<last>"
        )
    prefix = AGENT_PREFIX if indexes else named.group("prefix")
    first, last = int(named.group("first")), int(named.group("last"))
    if last < first:
        raise ValueError(f"range {item!r} runs backwards")
    if last - first >= MAX_ROSTER:
        raise ValueError(f"range {item!r} names more than {MAX_ROSTER} ids")
    return [f"{prefix}{i}" for i in range(first, last + 1)]
