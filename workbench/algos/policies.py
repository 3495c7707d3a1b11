"""Actor-critic policies for a pair of spaces: the network, its action distribution, and
the action an env gets from a sample. Shared by PPO and IMPALA."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from workbench.algos.base import DISCRETE, Spaces
from workbench.algos.distributions import Categorical, DiagGaussian, SquashedGaussian
from workbench.algos.networks import ActorCritic, GaussianActorCritic


class Policy(NamedTuple):
    """How PPO's network becomes a policy for one pair of spaces."""

    network: Any
    distribution: Callable
    """``distribution(network_policy_output) -> distribution``."""
    to_env: Callable
    """``to_env(distribution, sample) -> the action the env gets``."""
    continuous: bool


def make_policy(spaces: Spaces, config: Any) -> Policy:
    """The network and distribution for ``spaces``: categorical for discrete actions, a
    Gaussian for continuous ones, clipped to the bounds or squashed into them.

    ``config`` is an actor-critic algorithm's config: it has ``hidden_sizes``,
    ``activation``, ``log_std_init``, ``state_dependent_std``, ``squash`` and ``network``
    (a flax module of the user's, or None).
    """
    if spaces.action_kind == DISCRETE:
        network = config.network or ActorCritic(spaces.num_actions, tuple(config.hidden_sizes),
                                                config.activation)
        return Policy(network, Categorical, lambda dist, sample: sample, False)
    low = jnp.asarray(spaces.action_low, jnp.float32).reshape(spaces.action_shape)
    high = jnp.asarray(spaces.action_high, jnp.float32).reshape(spaces.action_shape)
    dim = int(np.prod(spaces.action_shape))
    network = config.network or GaussianActorCritic(
        dim, tuple(config.hidden_sizes), config.activation, config.log_std_init,
        config.state_dependent_std)
    if config.squash:
        return Policy(network, lambda out: SquashedGaussian(*out, low, high),
                      lambda dist, sample: dist.to_action(sample), True)
    return Policy(network, lambda out: DiagGaussian(*out),
                  lambda dist, sample: jnp.clip(sample, low, high), True)


