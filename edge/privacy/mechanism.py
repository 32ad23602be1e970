"""The privacy mechanism of one agent: the seam between ``[privacy]`` and the agent.

The agent asks it for two things: :meth:`PrivacyMechanism.train` in place of the task's own
``train`` (private steps, noise, masks; nothing else about the round changes), and
:meth:`PrivacyMechanism.spent` for the round's record (epsilon so far, and whether the
budget stopped training). Everything else (calibration, accounting, pair keys) is here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from airgossip.common.seeds import derive_seed
from airgossip.edge.privacy.accounting import Ledger, NetworkLedger, OpacusLedger, PrivacyError
from airgossip.edge.privacy.figures import Spent
from airgossip.edge.privacy.journal import PrivacyJournal
from airgossip.edge.privacy.keys import PairSecrets
from airgossip.edge.privacy.masks import PairMasks
from airgossip.edge.privacy.noise import resolve_noise
from airgossip.edge.privacy.plan import NoisePlan, PrivacyGraph
from airgossip.edge.privacy.settings import PrivacySettings
from airgossip.edge.privacy.training import PrivateTrainer
from airgossip.edge.tasks.base import SupportsPrivateTraining, Task, TrainConfig, TrainResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrivacyContext:
    """What the way of running agents knows and hands down: the fleet's graph (for the
    graph-aware mechanisms) and this agent's pair secrets (for cancelling masks)."""

    graph: PrivacyGraph | None = None
    secrets: PairSecrets | None = None


class PrivacyMechanism:
    """One agent's mechanism (see the module docstring): what it holds of the run (its
    noise plan, its ledger, its masks), with :attr:`kind`, the
    :class:`~airgossip.edge.privacy.mechanisms.base.Mechanism` ``[privacy]`` names, saying what
    differs.

    Parameters
    ----------
    settings:
        ``[privacy]``.
    task:
        The agent's task; it must support private training.
    agent_id, num_agents, rounds, seed:
        Who the agent is, the fleet's size, the run's rounds and the agent's own seed.
    context:
        Graph and secrets (see :class:`PrivacyContext`).
    run_context:
        Bytes every agent of the run shares (seed and fleet digest): the masks' keys are
        derived from it, so another run draws other masks.
    journal:
        Where the agent keeps what it spent across restarts (beside its checkpoints; None:
        in memory, for agents that keep no checkpoints). See :mod:`airgossip.edge.privacy.journal`.
    """

    def __init__(
        self,
        settings: PrivacySettings,
        task: Task,
        *,
        agent_id: str,
        num_agents: int,
        rounds: int,
        seed: int,
        context: PrivacyContext,
        run_context: bytes,
        journal: Path | None = None,
    ) -> None:
        if not isinstance(task, SupportsPrivateTraining):
            raise PrivacyError(
                f"privacy mechanism '{settings.mechanism}' clips every example's gradient, and "
                f"task '{task.name}' does not expose its model and data for that (a task needs "
                "private_training(parameters, config): digits has it; a Flower app can use "
                "Flower's own LocalDpMod instead)"
            )
        self.settings = settings
        self.kind = settings.mechanism
        self.task = task
        self.agent_id = agent_id
        self.plan: NoisePlan = resolve_noise(
            settings, rounds=rounds, num_agents=num_agents, graph=context.graph
        )
        self.journal = PrivacyJournal(journal)
        if self.journal.restarted:  # it runs rounds again: with new batches and new noise
            seed = derive_seed(seed, self.journal.entry.incarnation)
        self.trainer = PrivateTrainer(
            mechanism=self.kind.name,
            noise_multiplier=self.plan.noise_multiplier,
            max_grad_norm=settings.max_grad_norm,
            sample_rate=settings.sample_rate,
            seed=seed,
        )
        self.ledger: Ledger = self.kind.ledger(
            self.plan, settings, graph=context.graph, agent_id=agent_id,
            restarted=self.journal.restarted,
        )  # fmt: skip
        self.ledger.step(self.journal.entry.steps)
        self.masks: PairMasks | None = None
        if self.kind.pair_secrets:
            self.masks = self.kind.masks(
                agent_id, graph=context.graph, secrets=context.secrets,
                run_context=run_context, numel=task.initial_parameters().numel(),
            )  # fmt: skip
        self.exhausted = self.journal.entry.exhausted
        self._warned = False

    @property
    def steps_per_round(self) -> int:
        return self.settings.steps_per_round

    def _within_budget(self, round_index: int) -> bool:
        budget = self.settings.budget_epsilon
        if budget is None or self.exhausted:
            return not self.exhausted
        upcoming = self.ledger.epsilon(self.steps_per_round)
        if upcoming <= budget:
            return True
        if self.settings.on_budget == "stop":
            self.exhausted = self.journal.entry.exhausted = True
            self.journal.write()
            log.warning(
                "%s: round %d would spend epsilon %.4g of a budget of %.4g: it stops training "
                "on its data (%.4g spent) and goes on gossiping",
                self.agent_id, round_index, upcoming, budget, self.ledger.epsilon(),
            )  # fmt: skip
            return False
        if not self._warned:
            self._warned = True
            log.warning(
                "%s: round %d spends epsilon %.4g, past the budget of %.4g (on_budget = warn)",
                self.agent_id, round_index, upcoming, budget,
            )  # fmt: skip
        return True

    def train(
        self, start: torch.Tensor, config: TrainConfig, *, weight: float = 1.0
    ) -> TrainResult:
        """The round's private steps from ``start`` (or none past the budget), plus this
        agent's masks: what the agent adds to its state in place of the task's training.

        ``weight`` is the agent's push-sum weight ``y`` (1 for algorithms without one). The
        agent adds ``y`` times a step to its value ``x``, so that the estimate ``x / y``
        moves by the step. The one-step mechanisms instead add their step (update, noise and
        masks) to ``x`` as it is: each pair's masks then cancel in the fleet's total of
        ``x`` exactly whatever the weights (push-sum conserves that total under loss), and
        what an observer sees of a round is the update plus noise plus masks, the model
        their accounting is exact for. Their estimate moves by the step over ``y``.

        With ``gossip_rounds`` above 1, only the first round of every ``gossip_rounds`` takes
        the step; the others return ``start`` itself (the agent only gossips), so that the
        masks are averaged out of every model before the next gradient is taken.
        """
        assert isinstance(self.task, SupportsPrivateTraining)
        if not self.settings.private_round(config.round):
            return TrainResult(start, {}, 0)
        setup = self.task.private_training(start, config)
        metrics: dict[str, float] = {"lr": setup.lr}
        step, examples = torch.zeros(start.numel(), dtype=torch.float64), 0
        scale = setup.lr / (self.settings.sample_rate * setup.nominal_examples)
        if self._within_budget(config.round):
            self._spend(config.round)
            result = self.trainer.run(setup, self.steps_per_round)
            step = result.parameters.to(torch.float64) - start.to(torch.float64)
            examples, scale = result.examples, result.scale
            metrics["train_loss"] = result.loss
        if self.masks is not None:
            # Masks in units of one clipped gradient, moved as the step moves the model;
            # added even past the budget (they hold no data) so that partners' still cancel.
            std = self.plan.mask_multiplier * self.settings.max_grad_norm * scale
            step += self.masks.mask(config.round, std)
        if self.kind.one_step:
            step /= weight
        parameters = (start.to(torch.float64) + step).to(start.dtype)
        return TrainResult(parameters, metrics, examples)

    def _spend(self, round_index: int) -> None:
        """Account the round's steps, on disk first (see :mod:`airgossip.edge.privacy.journal`)."""
        steps, entry = self.steps_per_round, self.journal.entry
        rerun = round_index <= self.journal.previous_round
        entry.steps += steps
        entry.last_round = max(entry.last_round, round_index)
        entry.rerun_steps += steps if rerun else 0
        self.journal.write()
        self.ledger.step(steps)
        if rerun and self.masks is not None and isinstance(self.ledger, OpacusLedger):
            # The round's masks are the same as before the restart, so the two versions'
            # difference is unmasked: charge both as if the masks were known.
            self.ledger.charge(self.plan.noise_multiplier, 2 * steps)

    def spent(self) -> Spent:
        """What this agent has spent so far."""
        mean = self.ledger.mean_epsilon() if isinstance(self.ledger, NetworkLedger) else None
        return Spent(self.ledger.epsilon(), self.ledger.steps, mean, self.exhausted)

    def record_metrics(self) -> dict[str, float]:
        """:meth:`spent` as the figures of a round record."""
        return self.spent().as_metrics()
