"""What every privacy mechanism is, and what differs between them.

Every mechanism clips each example's gradient and adds Gaussian noise through Opacus
(:mod:`airgossip.edge.privacy.training`). They differ in how much noise each agent adds and how it
is calibrated (:meth:`Mechanism.plan`), what an agent adds to its state beside the step
(:meth:`Mechanism.masks`, :attr:`Mechanism.one_step`), what its accountant composes
(:meth:`Mechanism.ledger`) and which ``[privacy]`` settings it accepts (:meth:`Mechanism.refusal`,
:attr:`Mechanism.own_settings`). Each mechanism is one module with one class; :mod:`.registry` looks
them up by name, once, where ``[privacy]`` is parsed, and everything downstream holds the object.

Nothing here imports torch, numpy or Opacus when loaded (a settings error stays instant):
the computations import what they need when they run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from airgossip.edge.privacy.accounting import Ledger
    from airgossip.edge.privacy.keys import PairSecrets
    from airgossip.edge.privacy.masks import PairMasks
    from airgossip.edge.privacy.plan import NoisePlan, PrivacyGraph


class PrivacyParameters(Protocol):
    """What a mechanism reads of ``[privacy]``
    (:class:`~airgossip.edge.privacy.settings.PrivacySettings`)."""

    @property
    def noise_multiplier(self) -> float | None: ...
    @property
    def target_epsilon(self) -> float | None: ...
    @property
    def delta(self) -> float: ...
    @property
    def sample_rate(self) -> float: ...
    @property
    def steps_per_round(self) -> int: ...
    @property
    def gossip_rounds(self) -> int: ...
    @property
    def mask_multiplier(self) -> float | None: ...
    @property
    def adversary(self) -> str: ...
    @property
    def accountant(self) -> str: ...
    @property
    def masks_over_noise(self) -> float: ...
    def private_rounds(self, rounds: int) -> int: ...


def listed(names: Sequence[str], last: str = "and") -> str:
    """``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


class Mechanism:
    """One privacy mechanism: its name and what sets it apart (see the module docstring).

    Mechanisms hold no state: two objects of one class are equal, and one pickled into
    another process is the same mechanism there.
    """

    #: The ``[privacy] mechanism`` it is named by.
    name: ClassVar[str]
    #: One line for help texts and docs.
    summary: ClassVar[str]
    #: Whether it protects anything (False only for ``none``).
    enabled: ClassVar[bool] = True
    #: Its round is one noisy step: accounted as one update per round (``steps_per_round``
    #: must be 1), and the step is added to push-sum's value as it is (see
    #: :meth:`airgossip.edge.privacy.mechanism.PrivacyMechanism.train`).
    one_step: ClassVar[bool] = True
    #: Accounted for a noisy step in every round (no ``gossip_rounds`` between steps).
    every_round: ClassVar[bool] = False
    #: Its guarantee depends on the fleet's graph, which agents must be given.
    needs_graph: ClassVar[bool] = False
    #: Accounted for one graph that never changes.
    fixed_graph: ClassVar[bool] = False
    #: Every agent agrees a secret with each partner (TLS identities, or one process).
    pair_secrets: ClassVar[bool] = False
    #: Stepped through Opacus's accountants (``accountant = rdp`` or ``prv``).
    opacus_accounted: ClassVar[bool] = True
    #: ``[privacy]`` settings only this mechanism accepts (others refuse them set).
    own_settings: ClassVar[tuple[str, ...]] = ()
    #: What a results summary should add to the figure (None: nothing).
    caveat: ClassVar[str | None] = None

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def refusal(self, settings: PrivacyParameters, mechanisms: Sequence[Mechanism]) -> str | None:
        """Why ``settings`` cannot run with this mechanism (one line), or None.
        ``mechanisms``: every mechanism there is, to name those a setting is for."""
        if self.one_step and settings.steps_per_round != 1:
            return (
                f"[privacy] mechanism '{self}' takes one noisy step per round (its accounting "
                f"follows one update per round); steps_per_round = {settings.steps_per_round} "
                f"is for {listed([m.name for m in mechanisms if m.enabled and not m.one_step])}"
            )
        if self.every_round and settings.gossip_rounds != 1:
            spaced = [m.name for m in mechanisms if m.enabled and not m.every_round]
            return (
                f"[privacy] mechanism '{self}' is accounted for one noisy step every round "
                f"(its linear view of the graph); gossip_rounds = {settings.gossip_rounds} is "
                f"for {listed(spaced)}"
            )
        if not self.opacus_accounted and settings.accountant != "rdp":
            opacus = [m.name for m in mechanisms if m.enabled and m.opacus_accounted]
            return (
                f"[privacy] mechanism '{self}' is accounted exactly as a Gaussian mechanism of "
                f"the graph; accountant '{settings.accountant}' is for {listed(opacus)}"
            )
        return None

    def private_steps(self, settings: PrivacyParameters, rounds: int) -> int:
        """The private steps an agent takes in ``rounds`` rounds (what is composed)."""
        return settings.private_rounds(rounds) * settings.steps_per_round

    def plan(
        self,
        settings: PrivacyParameters,
        *,
        rounds: int,
        num_agents: int,
        graph: PrivacyGraph | None,
    ) -> NoisePlan:
        """The run's noise, calibrated (:class:`~airgossip.edge.privacy.plan.NoisePlan`);
        :class:`~airgossip.edge.privacy.accounting.PrivacyError` when no noise reaches the target.
        ``graph`` is given whenever :attr:`needs_graph`."""
        raise NotImplementedError

    def complete(self, plan: NoisePlan, *, rounds: int, graph: PrivacyGraph | None) -> NoisePlan:
        """``plan`` as carried from before the run (its multipliers only) made whole: what
        accounting needs beside them (network DP's sensitivities)."""
        return plan

    def calibrated(self, settings: PrivacyParameters, steps: int) -> float:
        """The multiplier that spends ``target_epsilon`` in ``steps`` Gaussian steps (Opacus's
        calibration), or ``noise_multiplier`` when it is given."""
        if settings.noise_multiplier is not None:
            return settings.noise_multiplier
        from airgossip.edge.privacy.accounting import opacus_noise_multiplier

        assert settings.target_epsilon is not None
        return opacus_noise_multiplier(
            settings.target_epsilon, settings.delta, settings.sample_rate, steps,
            settings.accountant, self.name,
        )  # fmt: skip

    def ledger(
        self,
        plan: NoisePlan,
        settings: PrivacyParameters,
        *,
        graph: PrivacyGraph | None,
        agent_id: str,
        restarted: bool,
    ) -> Ledger:
        """What one agent's accountant composes: Opacus's, stepped with the plan's
        accounted multiplier (``restarted``: the agent ran rounds before, see
        :mod:`airgossip.edge.privacy.journal`)."""
        from airgossip.edge.privacy.accounting import OpacusLedger

        return OpacusLedger(plan.accounted_multiplier, settings.sample_rate, settings.delta,
                            settings.accountant, self.name)  # fmt: skip

    def masks(
        self,
        agent_id: str,
        *,
        graph: PrivacyGraph | None,
        secrets: PairSecrets | None,
        run_context: bytes,
        numel: int,
    ) -> PairMasks | None:
        """What an agent adds to every push beside its step and noise (None: nothing)."""
        return None

    def adversary(self, settings: PrivacyParameters) -> str | None:
        """Whom its epsilon is against, where that is a setting (None: everyone)."""
        return None

    def accountant(self, settings: PrivacyParameters) -> str:
        """The accountant its figures come from."""
        return settings.accountant
