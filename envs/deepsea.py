"""bsuite's DeepSea in JAX (deterministic version): a sparse-reward exploration task."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class DeepSeaState(NamedTuple):
    row: jax.Array
    column: jax.Array
    t: jax.Array


@dataclass(frozen=True)
class DeepSea:
    """An ``size x size`` grid; the agent starts top-left and descends one row per step,
    moving one column left or right (clipped at the edges). Which action (0 or 1) means
    "right" differs per cell, drawn once from ``mapping_seed``. Each "right" costs
    ``0.01 / size``; going right at the bottom-right cell pays +1. Only the one all-right
    path reaches it, for a return of ``1 - 0.01``; every other path returns less.
    Every episode lasts ``size`` steps.

    Observation: float32 ``[size, size]``, one-hot at the agent's cell; all zeros once the
    agent has left the bottom row (the final observation), as in bsuite.
    """

    size: int = 10
    mapping_seed: int = 42
    right_action: np.ndarray = field(init=False, repr=False, compare=False)
    """``right_action[row, column]``: the action that moves right in that cell."""

    id: ClassVar[str] = "workbench/DeepSea-v0"
    num_actions: ClassVar[int] = 2
    observation_bounds: ClassVar[tuple[float, float]] = (0.0, 1.0)
    render_fps: ClassVar[int] = 8
    move_cost: ClassVar[float] = 0.01

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 2:
            raise ValueError(
                f"DeepSea size={self.size!r} was asked; it must be an integer >= 2 "
                "(bsuite uses 10 to 50)."
            )
        rng = np.random.default_rng(self.mapping_seed)
        mapping = rng.integers(0, 2, size=(self.size, self.size)).astype(np.int32)
        mapping.setflags(write=False)
        object.__setattr__(self, "right_action", mapping)

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return (self.size, self.size)

    @property
    def max_episode_steps(self) -> int:
        # Every episode terminates after exactly `size` steps; none is truncated.
        return self.size

    def optimal_actions(self) -> np.ndarray:
        """The action sequence of the only path that ends at the reward: right every step."""
        return np.array([self.right_action[r, r] for r in range(self.size)], dtype=np.int32)

    def _observe(self, state: DeepSeaState) -> jax.Array:
        grid = jnp.zeros((self.size, self.size), jnp.float32)
        # An index past the last row is dropped, which leaves the final observation empty.
        return grid.at[state.row, state.column].set(1.0, mode="drop")

    def reset(self, key: jax.Array) -> tuple[DeepSeaState, jax.Array]:
        del key  # the start is always the top-left cell
        zero = jnp.zeros((), jnp.int32)
        state = DeepSeaState(zero, zero, zero)
        return state, self._observe(state)

    def step(
        self, state: DeepSeaState, action: jax.Array, key: jax.Array
    ) -> tuple[DeepSeaState, jax.Array, jax.Array, jax.Array, jax.Array]:
        del key  # deterministic transitions and rewards
        mapping = jnp.asarray(self.right_action)
        row = jnp.minimum(state.row, self.size - 1)
        right = action.astype(jnp.int32) == mapping[row, state.column]
        reward = jnp.where(right, -self.move_cost / self.size, 0.0)
        reward += jnp.where(right & (state.column == self.size - 1), 1.0, 0.0)
        column = jnp.clip(state.column + jnp.where(right, 1, -1), 0, self.size - 1)
        new = DeepSeaState(state.row + 1, column, state.t + 1)
        terminated = new.row >= self.size
        truncated = (new.t >= self.max_episode_steps) & ~terminated
        return new, self._observe(new), reward.astype(jnp.float32), terminated, truncated

    def render(self, state: DeepSeaState) -> np.ndarray:
        n = self.size
        # One extra row below the grid shows where the agent landed.
        cell = max(1, 180 // (n + 1))
        image = np.full((n + 1, n, 3), 235, dtype=np.uint8)
        rows, cols = np.indices((n, n))
        image[:n][cols <= rows] = (200, 215, 240)  # the cells the agent can reach
        image[n - 1, n - 1] = (250, 200, 60)  # the rewarding cell
        row, col = int(np.asarray(state.row)), int(np.asarray(state.column))
        image[min(row, n), col] = (30, 60, 160)
        image = image.repeat(cell, axis=0).repeat(cell, axis=1)
        if cell >= 4:
            image[::cell, :] = 255
            image[:, ::cell] = 255
        return image
