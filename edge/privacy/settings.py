"""``[privacy]``: which mechanism protects the agents' training data, and how much.

One table for the whole fleet (every agent must add the same kind of noise for the guarantees to
hold), validated up front with one line per problem. The mechanism is looked up by name here, once
(:mod:`airgossip.edge.privacy.mechanisms.registry`): everything downstream holds it. See
``docs/privacy.md`` for what each mechanism guarantees and against whom.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    WithJsonSchema,
    model_validator,
)

from airgossip.edge.privacy.adversary import Adversary
from airgossip.edge.privacy.mechanisms.base import Mechanism
from airgossip.edge.privacy.mechanisms.registry import MECHANISMS, NO_PRIVACY, mechanism_named

#: ``[privacy] mechanism``: a name in the settings and on disk, a :class:`Mechanism` in code.
MechanismSetting = Annotated[
    Mechanism,
    PlainValidator(mechanism_named),
    PlainSerializer(lambda mechanism: mechanism.name, return_type=str),
    WithJsonSchema({"type": "string", "enum": list(MECHANISMS)}),
]


class ResolvedNoise(BaseModel):
    """The noise a run resolved before its agents started, carried to them in the run's
    config (the run fills it in; a scenario leaves it out). An agent uses it where
    ``inputs`` is what it would resolve the noise from, and resolves its own otherwise
    (:func:`airgossip.edge.privacy.noise.resolve_noise`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs: str = Field(
        description="what it was resolved from: a fingerprint of [privacy], the rounds, the "
        "fleet's size and, for graph mechanisms, its graph (with the format's version)"
    )
    noise_multiplier: float = Field(ge=0)
    mask_multiplier: float = Field(0.0, ge=0)
    accounted_multiplier: float = Field(0.0, ge=0)


class PrivacySettings(BaseModel):
    """``[privacy]``: the mechanism and its parameters (identical on every agent)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mechanism: MechanismSetting = NO_PRIVACY
    noise_multiplier: float | None = Field(
        None,
        ge=0,
        description="Gaussian noise over max_grad_norm (dp-sgd: per step; network-dp: per "
        "round; cancelling: the independent part; central: the curator's)",
    )
    target_epsilon: float | None = Field(
        None, gt=0, description="calibrate the noise to spend this epsilon by the last round"
    )
    delta: float = Field(1e-5, gt=0, lt=1)
    max_grad_norm: float = Field(1.0, gt=0, description="per-example gradient clipping bound")
    sample_rate: float = Field(
        1.0, gt=0, le=1, description="Poisson sampling rate of each example per step"
    )
    steps_per_round: int = Field(
        1, ge=1, le=10_000, description="private steps per round (dp-sgd only: the others take 1)"
    )
    gossip_rounds: int = Field(
        1,
        ge=1,
        le=1_000,
        description="rounds per private step: the step (noise, masks) in the first round of "
        "every gossip_rounds, the others only gossip (dp-sgd, cancelling, central)",
    )
    mask_multiplier: float | None = Field(
        None, ge=0, description="cancelling: std of each pairwise mask over max_grad_norm"
    )
    mask_ratio: float | None = Field(
        None,
        ge=0,
        description="cancelling: std of each pairwise mask over the independent noise's "
        "(default: gossip_rounds; or give mask_multiplier)",
    )
    adversary: Adversary = Field(
        "curious-agent",
        description="cancelling: whom epsilon is against: any one agent that also reads every "
        "link (knows its own masks), or an observer of every link that is no agent",
    )
    accountant: Literal["rdp", "prv"] = "rdp"
    budget_epsilon: float | None = Field(
        None, gt=0, description="epsilon an agent may spend; see on_budget"
    )
    on_budget: Literal["stop", "warn"] = Field(
        "stop",
        description="stop: an agent whose next round would spend more stops training on its "
        "data (it keeps gossiping); warn: it logs once and goes on",
    )

    resolved_noise: ResolvedNoise | None = Field(
        None, description="filled in by a run before its agents start: the noise it resolved"
    )

    @model_validator(mode="after")
    def _consistent(self) -> PrivacySettings:
        mechanism = self.mechanism
        if not mechanism.enabled:
            return self
        given = (self.noise_multiplier is not None) + (self.target_epsilon is not None)
        if given != 1:
            raise ValueError(
                f"[privacy] mechanism '{mechanism}' needs exactly one of noise_multiplier "
                f"or target_epsilon, got {'both' if given == 2 else 'neither'}"
            )
        refusal = mechanism.refusal(self, tuple(MECHANISMS.values()))
        if refusal is not None:
            raise ValueError(refusal)
        for name in ("mask_multiplier", "mask_ratio"):
            if getattr(self, name) is not None and name not in mechanism.own_settings:
                raise ValueError(f"[privacy] {name} is for mechanism '{_owner(name)}' only")
        if self.mask_multiplier is not None and self.mask_ratio is not None:
            raise ValueError(
                "[privacy] give mask_multiplier (each mask's std over max_grad_norm) or "
                "mask_ratio (over the independent noise's), not both"
            )
        default_adversary = PrivacySettings.model_fields["adversary"].default
        if self.adversary != default_adversary and "adversary" not in mechanism.own_settings:
            raise ValueError(
                f"[privacy] adversary = '{self.adversary}' is for mechanism "
                f"'{_owner('adversary')}' only (the guarantee of '{mechanism}' does not "
                "depend on who observes)"
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.mechanism.enabled

    @property
    def masks_over_noise(self) -> float:
        """Cancelling masks in units of the independent noise, unless ``mask_multiplier``
        fixes them: ``mask_ratio``, else ``gossip_rounds``. Larger masks let each agent add
        less independent noise for the same epsilon, and gossip must average them out of
        every model before the next gradient: on digits, 16 agents, exponential graph, a
        ratio equal to the rounds of gossip per step was the best measured with one round
        at epsilon 1 and 3 (of 0.5 to 8), and within 0.02 of central DP wherever any ratio
        of 1 to 16 was with 2, 4 and 8 (``docs/privacy.md``)."""
        return float(self.gossip_rounds) if self.mask_ratio is None else self.mask_ratio

    def private_round(self, round_index: int) -> bool:
        """Whether round ``round_index`` (from 1) takes the private step: the first of every
        ``gossip_rounds``."""
        return (round_index - 1) % self.gossip_rounds == 0

    def private_rounds(self, rounds: int) -> int:
        """How many of ``rounds`` rounds take the private step (what the accountant
        composes, times ``steps_per_round``)."""
        return -(-rounds // self.gossip_rounds)


def _owner(setting: str) -> str:
    """The mechanism whose own setting ``setting`` is."""
    return next(name for name, m in MECHANISMS.items() if setting in m.own_settings)
