"""The contract every JAX environment of the workbench follows.

An environment is a value (a frozen dataclass) with pure functions: ``reset`` and ``step``
take and return pytrees of JAX arrays, so a caller can ``jax.jit`` them, ``jax.vmap`` them
over a batch of environments and ``lax.scan`` them over time, all inside one compiled
program per chip (the Anakin mode). Nothing here imports JAX: importing the contract is free.

Optional attributes that the gymnasium view reads when an environment has them:

- ``observation_bounds: tuple[float, float] | tuple[np.ndarray, np.ndarray]``, the low and
  high of the observation space (default: unbounded);
- ``render_fps: int``, frames per second of an animation (default 30).

and one that Anakin mode reads:

- ``chip_typed: bool``, whether JAX's per-chip typing in ``shard_map`` accepts the env's
  own code (default True). An env that says False (brax, whose constraint solver has a
  ``cond`` that typing rejects) is compiled without that static check; the chips' state
  digests are compared either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import jax

State = Any
"""A NamedTuple of JAX arrays (scalars for one environment, leading batch axis under vmap)."""


@runtime_checkable
class JaxEnv(Protocol):
    """A functional environment with discrete actions ``0 .. num_actions - 1``.

    ``reset`` and ``step`` are pure, jittable and vmappable. ``step`` never resets: when an
    episode ends, the caller decides what comes next (usually a ``jnp.where`` between the
    stepped and a freshly reset state). Stepping a finished episode is allowed but its
    result has no meaning.
    """

    id: str
    """The registered id, e.g. ``"workbench/CartPole-v1"``."""
    num_actions: int
    observation_shape: tuple[int, ...]
    max_episode_steps: int
    """Episodes that reach this many steps without terminating are truncated."""

    def reset(self, key: jax.Array) -> tuple[State, jax.Array]:
        """Start an episode.

        Args:
            key: a JAX PRNG key.

        Returns:
            ``(state, obs)``: the start state (step counter 0) and its float32 observation.
        """
        ...

    def step(
        self, state: State, action: jax.Array, key: jax.Array
    ) -> tuple[State, jax.Array, jax.Array, jax.Array, jax.Array]:
        """Advance one step.

        Args:
            state: the current state.
            action: an integer action in ``0 .. num_actions - 1``.
            key: a JAX PRNG key, for environments with random transitions.

        Returns:
            ``(state, obs, reward, terminated, truncated)``: reward is a float32 scalar;
            terminated and truncated are bool scalars, and truncated is true only when the
            step counter reaches ``max_episode_steps`` without the episode terminating.
        """
        ...

    def render(self, state: State) -> np.ndarray:
        """Draw one (unbatched) state on the host.

        Args:
            state: a state of one environment (JAX or numpy arrays).

        Returns:
            A uint8 RGB image ``[H, W, 3]``, at most 200 pixels on a side.
        """
        ...
