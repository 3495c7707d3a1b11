"""Networks the algorithms share, as flax modules built from config values."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


class ActorCritic(nn.Module):
    """Separate tanh MLPs for the policy logits and the state value."""

    num_actions: int
    hidden_sizes: tuple[int, ...] = (64, 64)

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        obs = obs.reshape((obs.shape[0], -1)).astype(jnp.float32)
        actor = critic = obs
        for width in self.hidden_sizes:
            init = nn.initializers.orthogonal(np.sqrt(2))
            actor = nn.tanh(nn.Dense(width, kernel_init=init)(actor))
            critic = nn.tanh(nn.Dense(width, kernel_init=init)(critic))
        logits = nn.Dense(self.num_actions, kernel_init=nn.initializers.orthogonal(0.01))(actor)
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(critic)
        return logits, jnp.squeeze(value, -1)
