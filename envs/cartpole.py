"""CartPole in JAX, with the dynamics of gymnasium's CartPole-v1.

Same constants, explicit Euler integration, termination thresholds, a reward of 1.0 for every
step (the terminating one included), a start state uniform in [-0.05, 0.05] and truncation at
500 steps. Arithmetic is float32, where gymnasium keeps its state in float64; the two agree
to about 1e-7 per step, and that gap grows only through the pendulum's own instability.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_CART + MASS_POLE
HALF_POLE_LENGTH = 0.5
POLE_MASS_LENGTH = MASS_POLE * HALF_POLE_LENGTH
FORCE = 10.0
TAU = 0.02
THETA_LIMIT = 12 * 2 * math.pi / 360
X_LIMIT = 2.4


class CartPoleState(NamedTuple):
    x: jax.Array
    x_dot: jax.Array
    theta: jax.Array
    theta_dot: jax.Array
    t: jax.Array
    """Steps taken in this episode (int32)."""


def _observe(state: CartPoleState) -> jax.Array:
    return jnp.stack([state.x, state.x_dot, state.theta, state.theta_dot]).astype(jnp.float32)


@dataclass(frozen=True)
class CartPole:
    """The JAX CartPole: push the cart left (0) or right (1) to keep the pole upright.

    Observation: float32 ``[x, x_dot, theta, theta_dot]``.
    """

    max_episode_steps: int = 500

    id: ClassVar[str] = "workbench/CartPole-v1"
    num_actions: ClassVar[int] = 2
    observation_shape: ClassVar[tuple[int, ...]] = (4,)
    render_fps: ClassVar[int] = 50
    # The same bounds as gymnasium's space: twice the termination limits, so the observation
    # of the terminating step is still inside.
    observation_bounds: ClassVar[tuple[np.ndarray, np.ndarray]] = (
        -np.array([2 * X_LIMIT, np.inf, 2 * THETA_LIMIT, np.inf], dtype=np.float32),
        np.array([2 * X_LIMIT, np.inf, 2 * THETA_LIMIT, np.inf], dtype=np.float32),
    )

    def __post_init__(self) -> None:
        if not isinstance(self.max_episode_steps, int) or self.max_episode_steps < 1:
            raise ValueError(
                f"max_episode_steps={self.max_episode_steps!r} was asked; it must be a "
                "positive integer (gymnasium's CartPole-v1 uses 500)."
            )

    def reset(self, key: jax.Array) -> tuple[CartPoleState, jax.Array]:
        x, x_dot, theta, theta_dot = jax.random.uniform(
            key, (4,), dtype=jnp.float32, minval=-0.05, maxval=0.05
        )
        state = CartPoleState(x, x_dot, theta, theta_dot, jnp.zeros((), jnp.int32))
        return state, _observe(state)

    def step(
        self, state: CartPoleState, action: jax.Array, key: jax.Array
    ) -> tuple[CartPoleState, jax.Array, jax.Array, jax.Array, jax.Array]:
        del key  # the dynamics are deterministic
        force = jnp.where(action == 1, FORCE, -FORCE).astype(jnp.float32)
        cos, sin = jnp.cos(state.theta), jnp.sin(state.theta)
        # The equations of gymnasium's cartpole.py (Florian's corrected derivation), in
        # the same order, so float32 rounding is the only difference.
        temp = (force + POLE_MASS_LENGTH * jnp.square(state.theta_dot) * sin) / TOTAL_MASS
        theta_acc = (GRAVITY * sin - cos * temp) / (
            HALF_POLE_LENGTH * (4.0 / 3.0 - MASS_POLE * jnp.square(cos) / TOTAL_MASS)
        )
        x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS
        new = CartPoleState(
            x=state.x + TAU * state.x_dot,
            x_dot=state.x_dot + TAU * x_acc,
            theta=state.theta + TAU * state.theta_dot,
            theta_dot=state.theta_dot + TAU * theta_acc,
            t=state.t + 1,
        )
        terminated = (jnp.abs(new.x) > X_LIMIT) | (jnp.abs(new.theta) > THETA_LIMIT)
        truncated = (new.t >= self.max_episode_steps) & ~terminated
        return new, _observe(new), jnp.float32(1.0), terminated, truncated

    def render(self, state: CartPoleState) -> np.ndarray:
        from PIL import Image, ImageDraw

        width, height = 160, 100
        scale = width / (2 * X_LIMIT)
        track_y = 70
        cart_x = float(np.asarray(state.x)) * scale + width / 2
        theta = float(np.asarray(state.theta))
        image = Image.new("RGB", (width, height), (255, 255, 255))
        draw = ImageDraw.Draw(image)
        draw.line([(0, track_y + 6), (width, track_y + 6)], fill=(0, 0, 0), width=1)
        draw.rectangle([cart_x - 12, track_y - 6, cart_x + 12, track_y + 6], fill=(0, 0, 0))
        pole = scale * 2 * HALF_POLE_LENGTH
        tip = (cart_x + pole * math.sin(theta), track_y - pole * math.cos(theta))
        draw.line([(cart_x, track_y), tip], fill=(202, 152, 101), width=4)
        draw.ellipse([cart_x - 2, track_y - 2, cart_x + 2, track_y + 2], fill=(129, 132, 203))
        return np.asarray(image, dtype=np.uint8)
