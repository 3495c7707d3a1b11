"""bsuite's Catch in JAX: move a paddle along the bottom row to catch a falling ball."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class CatchState(NamedTuple):
    ball_row: jax.Array
    ball_col: jax.Array
    paddle_col: jax.Array
    t: jax.Array


@dataclass(frozen=True)
class Catch:
    """A ball starts in a random column of the top row and falls one row per step; the
    paddle on the bottom row moves left (0), stays (1) or moves right (2). When the ball
    reaches the bottom row the episode ends with +1 if the paddle is under it, else -1.
    Every episode lasts ``rows - 1`` steps; the best return is 1.0.

    Observation: the board, float32 ``[rows, columns]``, 1.0 at the ball and the paddle.
    """

    rows: int = 10
    columns: int = 5

    id: ClassVar[str] = "workbench/Catch-v0"
    num_actions: ClassVar[int] = 3
    observation_bounds: ClassVar[tuple[float, float]] = (0.0, 1.0)
    render_fps: ClassVar[int] = 8

    def __post_init__(self) -> None:
        for name, value, least in (("rows", self.rows, 2), ("columns", self.columns, 1)):
            if not isinstance(value, int) or value < least:
                raise ValueError(
                    f"Catch {name}={value!r} was asked; it must be an integer >= {least} "
                    "(bsuite uses rows=10, columns=5)."
                )

    @property
    def observation_shape(self) -> tuple[int, ...]:
        return (self.rows, self.columns)

    @property
    def max_episode_steps(self) -> int:
        # The ball always lands after rows - 1 steps, so no episode is ever truncated.
        return self.rows - 1

    def _observe(self, state: CatchState) -> jax.Array:
        board = jnp.zeros((self.rows, self.columns), jnp.float32)
        # A ball past the bottom row (a step after the episode ended) is dropped.
        board = board.at[state.ball_row, state.ball_col].set(1.0, mode="drop")
        return board.at[self.rows - 1, state.paddle_col].set(1.0)

    def reset(self, key: jax.Array) -> tuple[CatchState, jax.Array]:
        state = CatchState(
            ball_row=jnp.zeros((), jnp.int32),
            ball_col=jax.random.randint(key, (), 0, self.columns, dtype=jnp.int32),
            paddle_col=jnp.asarray(self.columns // 2, jnp.int32),
            t=jnp.zeros((), jnp.int32),
        )
        return state, self._observe(state)

    def step(
        self, state: CatchState, action: jax.Array, key: jax.Array
    ) -> tuple[CatchState, jax.Array, jax.Array, jax.Array, jax.Array]:
        del key  # the ball falls straight down
        paddle = jnp.clip(state.paddle_col + action.astype(jnp.int32) - 1, 0, self.columns - 1)
        new = CatchState(state.ball_row + 1, state.ball_col, paddle, state.t + 1)
        terminated = new.ball_row == self.rows - 1
        reward = jnp.where(
            terminated, jnp.where(paddle == state.ball_col, 1.0, -1.0), 0.0
        ).astype(jnp.float32)
        truncated = (new.t >= self.max_episode_steps) & ~terminated
        return new, self._observe(new), reward, terminated, truncated

    def render(self, state: CatchState) -> np.ndarray:
        cell = max(1, 180 // max(self.rows, self.columns))
        image = np.full((self.rows, self.columns, 3), 24, dtype=np.uint8)
        row, col = int(np.asarray(state.ball_row)), int(np.asarray(state.ball_col))
        image[self.rows - 1, int(np.asarray(state.paddle_col))] = (70, 130, 230)
        if row < self.rows:
            image[row, col] = (240, 90, 60)
        image = image.repeat(cell, axis=0).repeat(cell, axis=1)
        # Thin grid lines make single cells readable when the image is scaled in a notebook.
        image[::cell, :] = image[:, ::cell] = 48
        return image
