"""Networks the algorithms share, as flax modules built from config values."""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from workbench.algos.base import ACTIVATION_NAMES

ACTIVATIONS: dict[str, Callable] = {name: getattr(nn, name) for name in ACTIVATION_NAMES}


def activation(name: str) -> Callable:
    """The activation named ``name``.

    Raises:
        ValueError: not one of :data:`ACTIVATIONS`.
    """
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}.")
    return ACTIVATIONS[name]


def _flat(obs: jax.Array) -> jax.Array:
    return obs.reshape((obs.shape[0], -1)).astype(jnp.float32)


class ActorCritic(nn.Module):
    """Separate MLPs for the policy logits and the state value (discrete actions)."""

    num_actions: int
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        act = activation(self.activation)
        actor = critic = _flat(obs)
        for width in self.hidden_sizes:
            init = nn.initializers.orthogonal(np.sqrt(2))
            actor = act(nn.Dense(width, kernel_init=init)(actor))
            critic = act(nn.Dense(width, kernel_init=init)(critic))
        logits = nn.Dense(self.num_actions, kernel_init=nn.initializers.orthogonal(0.01))(actor)
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(critic)
        return logits, jnp.squeeze(value, -1)


class GaussianActorCritic(nn.Module):
    """Separate MLPs for a Gaussian policy's mean (and, if asked, its log-std) and the
    state value (continuous actions). Returns ``((mean, log_std), value)``."""

    action_dim: int
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    log_std_init: float = 0.0
    state_dependent_std: bool = False

    @nn.compact
    def __call__(self, obs: jax.Array):
        act = activation(self.activation)
        actor = critic = _flat(obs)
        for width in self.hidden_sizes:
            init = nn.initializers.orthogonal(np.sqrt(2))
            actor = act(nn.Dense(width, kernel_init=init)(actor))
            critic = act(nn.Dense(width, kernel_init=init)(critic))
        mean = nn.Dense(self.action_dim, kernel_init=nn.initializers.orthogonal(0.01))(actor)
        if self.state_dependent_std:
            log_std = nn.Dense(self.action_dim, kernel_init=nn.initializers.orthogonal(0.01),
                               bias_init=nn.initializers.constant(self.log_std_init))(actor)
        else:
            log_std = self.param("log_std", nn.initializers.constant(self.log_std_init),
                                 (self.action_dim,))
            log_std = jnp.broadcast_to(log_std, mean.shape)
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(critic)
        return (mean, jnp.clip(log_std, -20.0, 2.0)), jnp.squeeze(value, -1)


class QNetwork(nn.Module):
    """An MLP of Q-values with LayerNorm after every hidden layer, which is what lets PQN
    learn without a target network (Gallici et al., 2024)."""

    num_actions: int
    hidden_sizes: tuple[int, ...] = (128, 128)
    activation: str = "relu"
    layer_norm: bool = True

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        act = activation(self.activation)
        x = _flat(obs)
        for width in self.hidden_sizes:
            x = nn.Dense(width)(x)
            if self.layer_norm:
                x = nn.LayerNorm()(x)
            x = act(x)
        return nn.Dense(self.num_actions)(x)
