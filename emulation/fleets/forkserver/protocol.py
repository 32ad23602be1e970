"""What crosses the fork server's pipes: a request per child (launcher to server) and the
server's answers, one JSON object a line; and how long each side waits."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

#: How long the server waits for its children after SIGTERM before it SIGKILLs them.
CHILD_GRACE_S = 10.0
#: Longest wait for the server to answer a request (it first finishes its imports).
ANSWER_TIMEOUT_S = 180.0


class ForkServerError(RuntimeError):
    """The fork server could not start a child, or is gone."""


@dataclass(frozen=True)
class ForkRequest:
    """One child to fork (a JSON line to the server): ``python -m module args``, its output
    to ``log``, in ``cwd``."""

    id: int
    module: str
    args: tuple[str, ...]
    log: str
    cwd: str

    def line(self) -> bytes:
        """The request as the server reads it."""
        return (json.dumps({**asdict(self), "args": list(self.args)}) + "\n").encode()

    @classmethod
    def parse(cls, line: bytes) -> ForkRequest:
        """A request from its line."""
        data = json.loads(line)
        args = tuple(str(a) for a in data["args"])
        return cls(int(data["id"]), str(data["module"]), args, str(data["log"]), str(data["cwd"]))


@dataclass(frozen=True)
class ForkAnswer:
    """The server's answer to a request: the child's pid, or why there is none."""

    pid: int | None = None
    error: str | None = None
