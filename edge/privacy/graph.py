"""What the graph does to a guarantee: the two mechanisms whose privacy depends on who talks
to whom, computed for the actual graph (numpy only).

Both treat one coordinate of the model (the Gaussian mechanism is the same in every
coordinate) in units of the sensitivity of one round's update: one example's clipped
gradient, ``max_grad_norm``, times the step size over the fleet-wide normaliser. A noise
multiplier is a standard deviation in those units.

**Cancelling masks** (:func:`cancelling_noise_multiplier`). Every round each agent ``w``
adds its update, independent noise ``N(0, sigma^2)`` and, for every partner ``j``, a mask
``+-z_wj`` drawn from a secret it shares with ``j`` alone (``N(0, sigma_mask^2)``, opposite
signs at the two ends). The strongest observer without secrets, an eavesdropper on every
link, knows every state before the round and so sees ``d + eta + B z`` for the round: a
Gaussian mechanism with covariance ``sigma^2 I + sigma_mask^2 L`` (``L`` the Laplacian of
the pairs). A curious agent ``v`` that also eavesdrops knows the masks of its own pairs: its
covariance is the same over the other agents with ``v``'s pairs removed. Agent ``u``'s
update then reaches it through a Gaussian mechanism of sensitivity 1 and noise multiplier
``1 / sqrt(e_u' Sigma^-1 e_u)``. That holds round by round whatever the losses, since the
observer is granted every state. This is the single-round bound of DECOR (Allouah et al.,
ICML 2024, arXiv 2405.01031: SecLDP, the privacy theorem and its companion accountant,
``max_i (sigma_cdp^2 I + sigma_cor^2 L_H)^-1_ii`` over the honest agents ``H`` and the
pairs whose secrets the adversary lacks) for two adversaries (:data:`ADVERSARIES`):
``curious-agent``, one agent ``v`` (``H`` = the others), the worst ``v``; and
``eavesdropper``, no agent of the fleet (``H`` = everyone, every pair's secret unknown).

**Network DP** (:func:`network_sensitivities`, Muffliato-style). Agents add only
independent noise and gossip. A curious agent ``v`` sees what its in-neighbours send it,
round after round; the noise of every round and every agent but ``v`` masks it, and agents
far from ``v`` are seen only through many mixing steps. The view over ``T`` rounds is linear
in the updates and the noise: for an update of ``u`` shifted by ``delta_r`` in round ``r``
(``|delta_r| <= 1``) the view's mean moves by ``G delta`` under covariance ``Sigma``, and
the mechanism is Gaussian with ``mu^2 = max delta' Q delta``, ``Q = G' Sigma^-1 G``,
bounded by the sum of ``|Q|``'s entries. The rows of the view are ordered by round, so one
Cholesky factor gives ``mu`` after every round at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from airgossip.edge.privacy.adversary import ADVERSARIES

#: Most rows (rounds times in-neighbours) of one agent's view the exact network-DP
#: computation factorises; longer runs are accounted as local DP (a valid, weaker bound).
MAX_VIEW_ROWS = 4096


def pair_graph(adjacency: np.ndarray) -> np.ndarray:
    """The undirected pairs of a directed graph (either direction of a link makes a pair),
    as a symmetric boolean matrix with an empty diagonal."""
    a = np.asarray(adjacency, dtype=bool)
    pairs: np.ndarray = a | a.T
    np.fill_diagonal(pairs, False)
    return pairs


def laplacian(pairs: np.ndarray) -> np.ndarray:
    """The Laplacian ``D - A`` of an undirected graph."""
    a = pairs.astype(np.float64)
    return np.diag(a.sum(axis=1)) - a


def _reach(pairs: np.ndarray, noise_multiplier: float, mask_multiplier: float) -> np.ndarray:
    """``sqrt((Sigma^-1)_uu)`` for every agent ``u`` of ``pairs``, ``Sigma = sigma^2 I +
    sigma_mask^2 L``: the Gaussian mechanism through which ``u``'s round reaches an observer
    of every link that lacks these agents' noise and these pairs' secrets. Without
    independent noise ``Sigma`` is singular (the messages' sum shows the updates' sum):
    infinite."""
    n = pairs.shape[0]
    if noise_multiplier <= 0:
        return np.full(n, np.inf)
    cov = noise_multiplier**2 * np.eye(n) + mask_multiplier**2 * laplacian(pairs)
    return np.sqrt(np.maximum(np.diag(np.linalg.inv(cov)), 0.0))


def cancelling_sensitivities(
    pairs: np.ndarray, noise_multiplier: float, mask_multiplier: float
) -> np.ndarray:
    """``mu[u, v]``: the Gaussian mechanism through which agent ``u``'s round reaches a
    curious agent ``v`` that eavesdrops every link (``mu = 1 / effective noise multiplier``;
    the diagonal is 0). ``v`` knows its own noise and the masks it shares; no secret of
    another pair: :func:`_reach` over the other agents and their pairs."""
    n = pairs.shape[0]
    mu = np.zeros((n, n))
    for v in range(n):
        rest = [w for w in range(n) if w != v]
        if rest:
            mu[rest, v] = _reach(pairs[np.ix_(rest, rest)], noise_multiplier, mask_multiplier)
    return mu


def eavesdropper_sensitivities(
    pairs: np.ndarray, noise_multiplier: float, mask_multiplier: float
) -> np.ndarray:
    """``mu[u]``: the Gaussian mechanism through which agent ``u``'s round reaches an
    observer of every link that knows no pair's secret and no agent's noise (DECOR's
    eavesdropper): :func:`_reach` over all agents."""
    return _reach(pairs, noise_multiplier, mask_multiplier)


def cancelling_noise_multiplier(
    pairs: np.ndarray,
    noise_multiplier: float,
    mask_multiplier: float,
    adversary: str = "curious-agent",
) -> float:
    """The effective noise multiplier of the worst agent against ``adversary`` (the worst
    (agent, curious agent) pair, or the worst agent against the eavesdropper): what the
    accountant composes round after round for the cancelling mechanism."""
    n = pairs.shape[0]
    if adversary == "eavesdropper":
        worst = float(eavesdropper_sensitivities(pairs, noise_multiplier, mask_multiplier).max())
    elif adversary == "curious-agent":
        mu = cancelling_sensitivities(pairs, noise_multiplier, mask_multiplier)
        worst = max((mu[u, v] for u in range(n) for v in range(n) if u != v), default=0.0)
    else:
        raise ValueError(f"unknown adversary '{adversary}' (one of {', '.join(ADVERSARIES)})")
    return math.inf if worst == 0 else 1.0 / worst


def cancelling_limit(pairs: np.ndarray, adversary: str = "curious-agent") -> float:
    """How far masks can stretch the independent noise: the effective multiplier of the
    worst agent with infinitely large masks, per unit of independent noise:
    ``sqrt(size of u's component)`` of the pairs the adversary lacks the secret of. For a
    curious agent ``v`` the rest of the graph without ``v`` must stay connected: then it is
    ``sqrt(n - 1)``; for the eavesdropper ``sqrt(n)`` on a connected graph, central DP's
    figure (the noise of all ``n`` agents on the fleet's sum)."""
    n = pairs.shape[0]
    if adversary == "eavesdropper":
        return math.sqrt(min(_component_sizes(pairs), default=1))
    worst = math.inf
    for v in range(n):
        rest = [w for w in range(n) if w != v]
        for size in _component_sizes(pairs[np.ix_(rest, rest)]):
            worst = min(worst, math.sqrt(size))
    return 1.0 if worst == math.inf else worst


def _component_sizes(pairs: np.ndarray) -> list[int]:
    n = pairs.shape[0]
    seen = np.zeros(n, dtype=bool)
    sizes = []
    for start in range(n):
        if seen[start]:
            continue
        stack, size = [start], 0
        seen[start] = True
        while stack:
            node = stack.pop()
            size += 1
            for nxt in np.flatnonzero(pairs[node] & ~seen):
                seen[nxt] = True
                stack.append(int(nxt))
        sizes.append(size)
    return sizes


@dataclass(frozen=True)
class NetworkSensitivities:
    """Pairwise network-DP of a gossip run with unit independent noise.

    ``mu_squared[t - 1, u, v]`` bounds the squared sensitivity through which agent ``u``'s
    updates of rounds 1..t reach a curious agent ``v`` by the end of round ``t`` (noise
    multiplier 1; with multiplier ``sigma`` divide by ``sigma^2``). ``exact`` is False when
    the view was too large to factorise and the local-DP bound (``t``) stands in for it.
    """

    mu_squared: np.ndarray
    exact: bool

    @property
    def rounds(self) -> int:
        return int(self.mu_squared.shape[0])

    def at(self, rounds: int) -> np.ndarray:
        """The ``(n, n)`` matrix after ``rounds`` rounds (0 before the first)."""
        if rounds <= 0:
            return np.zeros(self.mu_squared.shape[1:])
        out: np.ndarray = self.mu_squared[min(rounds, self.rounds) - 1]
        return out


def network_sensitivities(
    mixing: np.ndarray, rounds: int, *, weights: np.ndarray | None = None
) -> NetworkSensitivities:
    """Squared sensitivities of every ordered pair after every round of a gossip run.

    Parameters
    ----------
    mixing:
        ``W``: ``W[j, i]`` is the share of agent ``i``'s state that goes to ``j`` (column
        stochastic; push-sum's weights).
    rounds:
        How many rounds to account.
    weights:
        ``(rounds, n)``: what scales each agent's update as it enters the state in each
        round (default: 1; the privacy mechanisms add their steps to push-sum's value as
        they are, see :meth:`airgossip.edge.privacy.mechanism.PrivacyMechanism.train`).

    The model of a round: ``s_t = W s_(t-1) + diag(y_t) (d_t + eta_t)`` and agent ``v``
    receives ``W[v, w] s_t[w]`` from each in-neighbour ``w``; ``v`` knows its own noise.
    """
    w = np.asarray(mixing, dtype=np.float64)
    n = w.shape[0]
    if weights is None:
        weights = np.ones((rounds, n))
    local = np.broadcast_to(np.arange(1, rounds + 1, dtype=np.float64)[:, None, None],
                            (rounds, n, n)).copy()  # fmt: skip
    for t in range(rounds):
        np.fill_diagonal(local[t], 0.0)
    incoming = [[j for j in np.flatnonzero(w[v]) if j != v] for v in range(n)]
    if max((len(s) for s in incoming), default=0) * rounds > MAX_VIEW_ROWS or n == 1:
        return NetworkSensitivities(local, exact=False)
    # powers[k] = W^k, the spread of a round's injection k rounds later
    powers = [np.eye(n)]
    for _ in range(rounds - 1):
        powers.append(w @ powers[-1])
    mu2 = np.zeros((rounds, n, n))
    for v in range(n):
        seen = incoming[v]
        if not seen:
            continue
        others = np.array([i for i in range(n) if i != v])
        d = len(seen)
        # influence[(t, k), (r, i)]: how much agent i's injection of round r moves what v
        # sees from seen[k] in round t (zero for r > t).
        influence = np.zeros((rounds * d, rounds, n))
        for t in range(rounds):
            for r in range(t + 1):
                influence[t * d : (t + 1) * d, r, :] = powers[t - r][seen, :] * weights[r]
        noise = influence[:, :, others].reshape(rounds * d, -1)
        cov = noise @ noise.T
        factor = np.linalg.cholesky(cov)
        for u in others:
            g = influence[:, :, u]  # (rows, rounds)
            m = _forward(factor, g)
            # Q after t rounds: the first t*d rows and t columns of m' m; the box bound
            # sums the absolute entries.
            q = np.zeros((rounds, rounds))
            for t in range(rounds):
                rows = m[t * d : (t + 1) * d, : t + 1]
                q[: t + 1, : t + 1] += rows.T @ rows
                mu2[t, u, v] = np.abs(q[: t + 1, : t + 1]).sum()
    return NetworkSensitivities(np.minimum(mu2, local), exact=True)


def _forward(lower: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``lower^-1 rhs`` for a lower-triangular ``lower``."""
    from scipy.linalg import solve_triangular

    out: np.ndarray = solve_triangular(lower, rhs, lower=True)
    return out
