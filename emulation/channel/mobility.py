"""Node mobility, time-stepped and vectorised: static, random waypoint, Gauss-Markov.

Every model takes its random draws from a generator the caller keys by ``(seed, step)``, so
the trajectory is a function of the seed alone. Nodes stay inside a rectangle ``[0, W] x
[0, H]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class MobilityState:
    """Positions (n, 2) in metres and velocities (n, 2) in m/s, plus model memory."""

    positions: np.ndarray
    velocities: np.ndarray
    targets: np.ndarray | None = None  # random waypoint: current waypoint
    pause_left: np.ndarray | None = None  # random waypoint: seconds of pause left
    speed: np.ndarray | None = None  # Gauss-Markov
    direction: np.ndarray | None = None  # Gauss-Markov
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def speeds(self) -> np.ndarray:
        return np.asarray(np.linalg.norm(self.velocities, axis=1))


class StaticMobility:
    """Nodes that never move: given positions, or uniform in the area."""

    def __init__(self, area: tuple[float, float], positions: np.ndarray | None = None) -> None:
        self.area = area
        self.positions = positions

    def initial(self, n: int, rng: np.random.Generator) -> MobilityState:
        if self.positions is not None:
            pos = np.asarray(self.positions, dtype=np.float64).reshape(n, 2)
        else:
            pos = rng.uniform(0.0, 1.0, (n, 2)) * np.asarray(self.area)
        return MobilityState(pos, np.zeros((n, 2)))

    def step(self, state: MobilityState, dt: float, rng: np.random.Generator) -> MobilityState:
        return state


class RandomWaypoint:
    """Random waypoint: walk to a uniform waypoint at a uniform speed, pause, repeat.

    The minimum speed must be positive; with speeds down to 0 the average speed decays
    over time (Yoon, Liu and Noble, 2003).
    """

    def __init__(
        self, area: tuple[float, float], min_speed: float, max_speed: float, pause_s: float = 0.0
    ) -> None:
        if min_speed <= 0:
            raise ValueError("random waypoint needs a minimum speed > 0 (else the speed decays)")
        if max_speed < min_speed:
            raise ValueError("random waypoint: max speed must be >= min speed")
        self.area = np.asarray(area, dtype=np.float64)
        self.min_speed, self.max_speed, self.pause_s = min_speed, max_speed, pause_s

    def _new_leg(
        self, pos: np.ndarray, rng: np.random.Generator, count: int
    ) -> tuple[np.ndarray, np.ndarray]:
        target = rng.uniform(0.0, 1.0, (count, 2)) * self.area
        speed = rng.uniform(self.min_speed, self.max_speed, count)
        delta = target - pos
        norm = np.maximum(np.linalg.norm(delta, axis=1, keepdims=True), 1e-9)
        return target, delta / norm * speed[:, None]

    def initial(self, n: int, rng: np.random.Generator) -> MobilityState:
        pos = rng.uniform(0.0, 1.0, (n, 2)) * self.area
        target, vel = self._new_leg(pos, rng, n)
        return MobilityState(pos, vel, targets=target, pause_left=np.zeros(n))

    def step(self, state: MobilityState, dt: float, rng: np.random.Generator) -> MobilityState:
        assert state.targets is not None and state.pause_left is not None
        pos, vel = state.positions.copy(), state.velocities.copy()
        target, pause = state.targets.copy(), state.pause_left.copy()
        n = pos.shape[0]
        # Draws for every node every step, used or not: the stream stays aligned per node.
        fresh_target, fresh_vel = self._new_leg(pos, rng, n)
        paused = pause > 0
        pause = np.maximum(pause - dt, 0.0)
        moving = ~paused
        remaining = np.linalg.norm(target - pos, axis=1)
        reach = moving & (np.linalg.norm(vel, axis=1) * dt >= remaining)
        go = moving & ~reach
        pos[go] += vel[go] * dt
        pos[reach] = target[reach]
        pause[reach] = self.pause_s
        # A node whose pause ended (or that arrived with no pause) starts a new leg.
        restart = (paused & (pause <= 0)) | (reach & (self.pause_s <= 0))
        target[restart] = fresh_target[restart]
        delta = target[restart] - pos[restart]
        norm = np.maximum(np.linalg.norm(delta, axis=1, keepdims=True), 1e-9)
        vel[restart] = delta / norm * np.linalg.norm(fresh_vel[restart], axis=1, keepdims=True)
        vel[reach & (self.pause_s > 0)] = 0.0
        return MobilityState(pos, vel, targets=target, pause_left=pause)


class GaussMarkov:
    """Gauss-Markov mobility: speed and direction are AR(1) around their means.

    ``s_n = a s_{n-1} + (1 - a) s_mean + sqrt(1 - a^2) sigma w_n`` (the same for the
    direction); near a wall the mean direction points back into the area.
    """

    def __init__(
        self,
        area: tuple[float, float],
        mean_speed: float,
        speed_sigma: float,
        memory: float = 0.85,
        direction_sigma: float = 0.6,
    ) -> None:
        if not 0 <= memory <= 1:
            raise ValueError("Gauss-Markov memory must be within [0, 1]")
        self.area = np.asarray(area, dtype=np.float64)
        self.mean_speed, self.speed_sigma = mean_speed, speed_sigma
        self.memory, self.direction_sigma = memory, direction_sigma

    def initial(self, n: int, rng: np.random.Generator) -> MobilityState:
        pos = rng.uniform(0.0, 1.0, (n, 2)) * self.area
        speed = np.full(n, self.mean_speed)
        direction = rng.uniform(0.0, 2.0 * math.pi, n)
        vel = np.stack([np.cos(direction), np.sin(direction)], axis=1) * speed[:, None]
        return MobilityState(pos, vel, speed=speed, direction=direction)

    def step(self, state: MobilityState, dt: float, rng: np.random.Generator) -> MobilityState:
        assert state.speed is not None and state.direction is not None
        a, n = self.memory, state.positions.shape[0]
        noise = rng.standard_normal((n, 2))
        # Mean direction: onward, but towards the centre when within 10% of a wall.
        centre = self.area / 2.0 - state.positions
        near_wall = np.any(
            (state.positions < 0.1 * self.area) | (state.positions > 0.9 * self.area), axis=1
        )
        mean_dir = np.where(near_wall, np.arctan2(centre[:, 1], centre[:, 0]), state.direction)
        scale = math.sqrt(max(1.0 - a * a, 0.0))
        speed = a * state.speed + (1 - a) * self.mean_speed + scale * self.speed_sigma * noise[:, 0]
        speed = np.maximum(speed, 0.0)
        direction = (
            a * state.direction + (1 - a) * mean_dir + scale * self.direction_sigma * noise[:, 1]
        )
        vel = np.stack([np.cos(direction), np.sin(direction)], axis=1) * speed[:, None]
        pos = np.clip(state.positions + vel * dt, 0.0, self.area)
        return MobilityState(pos, vel, speed=speed, direction=direction)


Mobility = StaticMobility | RandomWaypoint | GaussMarkov
