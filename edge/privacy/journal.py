"""What an agent has spent, kept on disk ahead of spending it, so that a restart from a
checkpoint never forgets a private step.

A checkpoint rolls an agent back to an earlier round; the rounds it had run since were
seen by its neighbours all the same, and it runs them again. The journal is written before
every round's private steps (atomically), so after a crash it holds at least every step
taken: the restarted agent's accountant goes on from there, draws its noise from a new
stream (the incarnation is in its seed) and knows which rounds it runs a second time.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from airgossip.common.security.private_files import open_private


@dataclass
class JournalEntry:
    """An agent's spending so far.

    Attributes
    ----------
    incarnation:
        How many times the agent has started (1 for a first start).
    steps:
        Private steps taken, by every incarnation.
    last_round:
        The last round whose steps any incarnation started.
    rerun_steps:
        Steps of rounds run a second time (after a restart).
    exhausted:
        The budget stopped training.
    """

    incarnation: int = 0
    steps: int = 0
    last_round: int = 0
    rerun_steps: int = 0
    exhausted: bool = False


class PrivacyJournal:
    """One agent's :class:`JournalEntry` in ``path`` (None: kept in memory only)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entry = JournalEntry()
        if path is not None and path.exists():
            try:
                self.entry = JournalEntry(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError) as err:
                raise ValueError(
                    f"privacy journal {path} is unreadable ({err}); an agent that cannot "
                    "tell what it spent does not start"
                ) from None
        self.previous_round = self.entry.last_round
        self.entry.incarnation += 1
        self.write()

    @property
    def restarted(self) -> bool:
        return self.entry.incarnation > 1

    def write(self) -> None:
        """Write the entry (write, flush to disk, rename: a crash leaves the old or the new)."""
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.unlink(missing_ok=True)
        with open_private(tmp, "x") as handle:
            handle.write(json.dumps(asdict(self.entry)))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)
