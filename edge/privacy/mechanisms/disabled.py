"""``none``: no privacy mechanism; the agents train their tasks as they are."""

from __future__ import annotations

from typing import ClassVar

from airgossip.edge.privacy.mechanisms.base import Mechanism


class NoPrivacy(Mechanism):
    """No mechanism: nothing is clipped, noised or accounted."""

    name: ClassVar[str] = "none"
    summary: ClassVar[str] = "no privacy: the task trains as it is"
    enabled: ClassVar[bool] = False
