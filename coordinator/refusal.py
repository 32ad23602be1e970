"""The one way the coordinator turns a request down."""

from __future__ import annotations


class Refusal(Exception):
    """A request the coordinator turns down; ``code`` names the gRPC status, ``reason`` says
    what was wrong and what is allowed."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason
