"""What crosses between the Flower baseline's launcher and its simulation process: the job
(``baseline.json``, launcher to process) and one line of ``rounds.jsonl`` per evaluated
round (process to launcher)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from airgossip.common.security.private_files import write_private

#: A value of a Flower run config (Flower's own types; Flower is imported only where it runs).
RunConfigValue = bool | int | float | str


class FlowerJob(BaseModel):
    """One baseline run: the app, its run config overrides and how the engine runs it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    app: str
    run_config: dict[str, RunConfigValue]
    agents: int
    seed: int
    client_cpus: float
    accuracy_metric: str | None
    loss_metric: str | None
    #: Ray's session folder (short: it holds Unix sockets).
    ray_dir: str
    #: The launcher: the engine's process group ends when it does.
    parent_pid: int

    def write(self, path: Path) -> None:
        """Write the job where the simulation process reads it."""
        write_private(path, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> FlowerJob:
        """The job at ``path``."""
        return cls.model_validate_json(path.read_text())


class FlowerRound(BaseModel):
    """One evaluated round of the ServerApp as the simulation process saw it."""

    model_config = ConfigDict(extra="forbid")

    round: int
    accuracies: list[float] = []
    losses: list[float] = []
    #: Evaluate replies that were errors.
    failed: int = 0
    wall_s: float = 0.0
    #: Bytes and messages that crossed the grid so far (to and from the server).
    bytes_sent: int = 0
    messages_sent: int = 0
    #: Why replies failed (the first error's reason).
    reason: str = ""
