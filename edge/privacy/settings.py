"""``[privacy]``: which mechanism protects the agents' training data, and how much.

One table for the whole fleet (every agent must add the same kind of noise for the
guarantees to hold), validated up front with one line per problem. See ``docs/privacy.md``
for what each mechanism guarantees and against whom.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: The mechanisms by name: ``none``; ``dp-sgd``, local DP-SGD through Opacus;
#: ``network-dp``, noise once per round and gossip (Muffliato); ``cancelling``, pairwise
#: masks that cancel in the fleet's sum plus a little independent noise (DECOR); ``central``,
#: the noise a trusted curator would add to the fleet's sum (a reference: it protects nothing
#: from neighbours, who see every agent's model).
MECHANISMS = ("none", "dp-sgd", "network-dp", "cancelling", "central")
#: Mechanisms whose round is one noisy step: their accounting sees one update per round.
ONE_STEP_MECHANISMS = ("network-dp", "cancelling", "central")
#: Whom the cancelling mechanism's epsilon is against (DECOR's SecLDP, docs/privacy.md):
#: ``curious-agent``, any one agent of the fleet that also reads every link (it knows its
#: own noise and the secrets of its own pairs); ``eavesdropper``, an observer of every link
#: that is no agent (it knows no pair's secret and no agent's noise), as the coordinator.
Adversary = Literal["curious-agent", "eavesdropper"]
ADVERSARIES: tuple[str, ...] = get_args(Adversary)


class PrivacySettings(BaseModel):
    """``[privacy]``: the mechanism and its parameters (identical on every agent)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mechanism: Literal["none", "dp-sgd", "network-dp", "cancelling", "central"] = "none"
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

    @model_validator(mode="after")
    def _consistent(self) -> PrivacySettings:
        if self.mechanism == "none":
            return self
        given = (self.noise_multiplier is not None) + (self.target_epsilon is not None)
        if given != 1:
            raise ValueError(
                f"[privacy] mechanism '{self.mechanism}' needs exactly one of noise_multiplier "
                f"or target_epsilon, got {'both' if given == 2 else 'neither'}"
            )
        if self.mechanism in ONE_STEP_MECHANISMS and self.steps_per_round != 1:
            raise ValueError(
                f"[privacy] mechanism '{self.mechanism}' takes one noisy step per round (its "
                f"accounting follows one update per round); steps_per_round = "
                f"{self.steps_per_round} is for dp-sgd"
            )
        if self.gossip_rounds != 1 and self.mechanism == "network-dp":
            raise ValueError(
                "[privacy] mechanism 'network-dp' is accounted for one noisy step every round "
                f"(its linear view of the graph); gossip_rounds = {self.gossip_rounds} is for "
                "dp-sgd, cancelling and central"
            )
        for name in ("mask_multiplier", "mask_ratio"):
            if getattr(self, name) is not None and self.mechanism != "cancelling":
                raise ValueError(f"[privacy] {name} is for mechanism 'cancelling' only")
        if self.mask_multiplier is not None and self.mask_ratio is not None:
            raise ValueError(
                "[privacy] give mask_multiplier (each mask's std over max_grad_norm) or "
                "mask_ratio (over the independent noise's), not both"
            )
        if self.adversary != "curious-agent" and self.mechanism != "cancelling":
            raise ValueError(
                f"[privacy] adversary = '{self.adversary}' is for mechanism 'cancelling' only "
                f"(the guarantee of '{self.mechanism}' does not depend on who observes)"
            )
        if self.accountant == "prv" and self.mechanism == "network-dp":
            raise ValueError(
                "[privacy] mechanism 'network-dp' is accounted exactly as a Gaussian mechanism "
                "of the graph; accountant 'prv' is for dp-sgd, cancelling and central"
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.mechanism != "none"

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
