"""Validated settings of one agent, shared by every way of running it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from airgossip.edge.compression.forms import check_compression
from airgossip.edge.privacy.settings import PrivacySettings

if TYPE_CHECKING:
    import torch

    from airgossip.edge.compression import Codec

# The registries (and torch, which they import) are imported where a check needs them: a
# setting that is wrong on its own (a bound, a type, a name) is refused without them, so
# the command line answers it at once.


#: The most gossip steps per local step ``mixing_steps`` may ask for.
MAX_MIXING_STEPS = 16


class TaskSettings(BaseModel):
    """``[task]``: the task's name plus its own options, side by side."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = "digits"

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class AgentSettings(BaseModel):
    """How an agent learns and gossips; identical on every agent of a fleet."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: TaskSettings = Field(default_factory=TaskSettings)
    algorithm: str = "push-sum"
    rounds: int = Field(40, ge=1, le=10_000_000)
    seed: int = Field(0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "float32", "float64"] = Field(
        "auto", description="gossip state precision; auto follows the task"
    )
    compression: str = Field(
        "none", description="codec of every message; none: lossless in the gossip precision"
    )
    algorithm_options: dict[str, Any] = Field(
        default_factory=dict, description="the algorithm's own options (gamma, period, ...)"
    )
    eval_every: int = Field(1, ge=1)
    staleness: int = Field(2, ge=0, description="rounds an agent may run ahead of in-neighbours")
    wait_timeout_s: float = Field(
        0.25, ge=0, le=600, description="longest wait for in-neighbours per round"
    )
    pace: Literal["rounds", "async"] = Field(
        "rounds",
        description="rounds: wait (at most wait_timeout_s) for in-neighbours within staleness "
        "rounds; async: for its own sends only, each agent at its own pace (and in the last "
        "round for the in-neighbours' last messages)",
    )
    mixing_steps: int | Literal["auto"] = Field(
        "auto",
        description="gossip steps (push, wait, mix) per local step; auto: a periodic graph's "
        "whole period, then fewer where agent processes measure that they do not pay "
        '(docs/algorithms.md, "Mixing steps per round")',
    )
    privacy: PrivacySettings = Field(
        default_factory=PrivacySettings, description="differential privacy of the training data"
    )

    def reports(self, round_index: int) -> bool:
        """Whether ``round_index`` is evaluated and reported: every ``eval_every`` rounds and
        the last."""
        return round_index % self.eval_every == 0 or round_index == self.rounds

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, value: str) -> str:
        from airgossip.edge.algorithms.registry import ALGORITHMS

        if value not in ALGORITHMS:
            raise ValueError(f"unknown algorithm '{value}'; choose one of: {', '.join(ALGORITHMS)}")
        return value

    @field_validator("mixing_steps")
    @classmethod
    def _mixing_steps_in_range(cls, value: int | str) -> int | str:
        if value != "auto" and not 1 <= int(value) <= MAX_MIXING_STEPS:
            raise ValueError(
                f'mixing_steps is "auto" or a number of gossip steps per local step from 1 '
                f"to {MAX_MIXING_STEPS}, got {value}"
            )
        return value

    @field_validator("compression")
    @classmethod
    def _known_compression(cls, value: str) -> str:
        return check_compression(value)  # a bad one raises a ValueError saying what is allowed

    @model_validator(mode="after")
    def _algorithm_accepts(self) -> AgentSettings:
        from airgossip.edge.algorithms.registry import algorithm_class, check_algorithm_settings
        from airgossip.edge.compression.registry import get_codec

        codec = get_codec(self.compression) if self.compression != "none" else get_codec("float32")
        check_algorithm_settings(self.algorithm, codec, self.algorithm_options)
        several = self.mixing_steps != "auto" and int(self.mixing_steps) > 1
        if several and not algorithm_class(self.algorithm).several_mixes:
            raise ValueError(
                f"algorithm '{self.algorithm}' mixes once per local step (mixing_steps "
                f"{self.mixing_steps}); several gossip steps per local step need push-sum"
            )
        if self.privacy.enabled and algorithm_class(self.algorithm).needs_distillation:
            raise ValueError(
                f"[privacy] accounts the task's training, and algorithm '{self.algorithm}' "
                "also distils on the agent's data, which nothing would account; use an "
                "algorithm that averages parameters"
            )
        return self


def gossip_dtype(settings: AgentSettings, task_dtype: torch.dtype) -> torch.dtype:
    """The gossip state's dtype: the setting, or what the task asks for."""
    import torch

    if settings.precision == "float64":
        return torch.float64
    if settings.precision == "float32":
        return torch.float32
    return task_dtype


def resolve_codec(settings: AgentSettings, dtype: torch.dtype) -> Codec:
    """The codec of every message: the ``compression`` setting, or lossless in ``dtype``."""
    from airgossip.edge.compression.registry import get_codec, raw_codec_for

    if settings.compression == "none":
        return raw_codec_for(dtype)
    return get_codec(settings.compression)


def resolve_device(choice: str) -> torch.device:
    """``auto`` picks CUDA when present; ``cuda`` without a GPU is an error."""
    import torch

    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA GPU; use auto or cpu")
    if choice not in ("cpu", "cuda"):
        raise ValueError(f"unknown device '{choice}'; choose one of: auto, cpu, cuda")
    return torch.device(choice)
