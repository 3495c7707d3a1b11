"""PPO as pure functions on pytrees: GAE, the clipped loss, the update step, acting.

Nothing here knows about Ray, processes or chips. The update averages its gradients
through the :class:`~workbench.algos.base.ChipMean` it is handed, which is how every chip
of a slice ends each update with the same parameters when the learn layer shares the work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from workbench.algos.base import Agent, ChipMean, Spaces, Trajectory
from workbench.algos.normalize import (
    RunningStats,
    forward_returns,
    init_stats,
    normalize,
    update_stats,
)
from workbench.algos.policies import Policy, make_policy
from workbench.algos.ppo.config import PPOConfig


class Batch(NamedTuple):
    """Flat per-sample training data."""

    obs: jax.Array
    actions: jax.Array
    log_probs: jax.Array
    advantages: jax.Array
    returns: jax.Array
    valid: jax.Array


class PPOState(NamedTuple):
    params: Any
    opt_state: Any
    obs_stats: RunningStats
    """Running observation statistics (used when ``normalize_observations``)."""
    return_stats: RunningStats
    """Running statistics of discounted returns (used when ``scale_rewards``)."""


def gae(
    rewards: jax.Array,
    values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    last_value: jax.Array,
    gamma: float,
    gae_lambda: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimates and value targets for ``[T, N]`` arrays.

    A terminated step does not bootstrap; a truncated one bootstraps from the value of
    the step after it (with next-step reset, that step's observation is the final one).
    Either ends the recursion, so advantages never leak across episodes.

    Returns:
        ``(advantages, returns)``, both ``[T, N]``.
    """
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    not_terminated = 1.0 - terminated.astype(jnp.float32)
    not_done = not_terminated * (1.0 - truncated.astype(jnp.float32))
    deltas = rewards + gamma * next_values * not_terminated - values

    def step(carry, inputs):
        delta, keep = inputs
        advantage = delta + gamma * gae_lambda * keep * carry
        return advantage, advantage

    _, advantages = jax.lax.scan(
        step, jnp.zeros_like(last_value), (deltas, not_done), reverse=True
    )
    return advantages, advantages + values


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


LossFn = Callable[[Any, Callable, Batch, PPOConfig], tuple[jax.Array, dict[str, jax.Array]]]


def ppo_loss(
    params: Any, apply_fn: Callable, batch: Batch, config: PPOConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The clipped-surrogate PPO loss with a value loss and an entropy bonus.

    ``apply_fn(params, obs) -> (distribution, values)``: the distribution gives
    ``log_prob(actions)`` and ``entropy()`` (see :mod:`workbench.algos.distributions`).

    Returns:
        ``(loss, metrics)`` where metrics holds the loss terms, entropy and clip fraction.
    """
    dist, values = apply_fn(params, batch.obs)
    log_probs = dist.log_prob(batch.actions)
    mask = batch.valid
    advantages = batch.advantages
    if config.normalize_advantages:
        mean = masked_mean(advantages, mask)
        std = jnp.sqrt(masked_mean((advantages - mean) ** 2, mask))
        advantages = (advantages - mean) / (std + 1e-8)
    ratio = jnp.exp(log_probs - batch.log_probs)
    clipped = jnp.clip(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps)
    policy_loss = -masked_mean(jnp.minimum(ratio * advantages, clipped * advantages), mask)
    value_loss = 0.5 * masked_mean((values - batch.returns) ** 2, mask)
    entropy = masked_mean(dist.entropy(), mask)
    loss = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
    clip_fraction = masked_mean((jnp.abs(ratio - 1.0) > config.clip_eps).astype(jnp.float32), mask)
    return loss, {
        "loss": loss,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "clip_fraction": clip_fraction,
    }


def make_optimizer(config: PPOConfig, num_updates: int) -> optax.GradientTransformation:
    steps_per_update = config.num_epochs * config.num_minibatches
    if config.anneal_lr:
        learning_rate = optax.linear_schedule(
            config.learning_rate, 0.0, max(1, num_updates * steps_per_update)
        )
    else:
        learning_rate = config.learning_rate
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(learning_rate, eps=1e-5),
    )


def flatten(trajectory: Trajectory, advantages: jax.Array, returns: jax.Array) -> Batch:
    def merge(x: jax.Array) -> jax.Array:
        return x.reshape((-1,) + x.shape[2:])

    # A continuous policy learns from its raw samples (before clipping or squashing).
    actions = trajectory.extras.get("raw_action", trajectory.actions)
    return Batch(
        obs=merge(trajectory.obs),
        actions=merge(actions),
        log_probs=merge(trajectory.extras["log_prob"]),
        advantages=merge(advantages),
        returns=merge(returns),
        valid=merge(trajectory.valid).astype(jnp.float32),
    )


def _observe(config: PPOConfig, stats: RunningStats, obs: jax.Array) -> jax.Array:
    return normalize(stats, obs) if config.normalize_observations else obs


def make_update(
    policy: Policy,
    optimizer: optax.GradientTransformation,
    config: PPOConfig,
    loss_fn: LossFn = ppo_loss,
) -> Callable[[PPOState, Trajectory, jax.Array, ChipMean], tuple[PPOState, dict]]:
    """Build one PPO update: GAE, then epochs of shuffled minibatch gradient steps.

    Args:
        policy: the network and its distribution (:func:`make_policy`).
        optimizer: an optax transformation.
        config: PPO hyperparameters.
        loss_fn: ``loss_fn(params, apply_fn, batch, config) -> (loss, metrics)``; swap in
            your own to change the algorithm.

    Returns:
        ``update(state, trajectory, key, chips) -> (state, metrics)``, pure and jittable;
        ``chips`` averages each minibatch's gradient (and the running statistics) over
        the chips that learn together.
    """
    network = policy.network

    def apply(params, obs):
        out, values = network.apply(params, obs)
        return policy.distribution(out), values

    def update(state: PPOState, trajectory: Trajectory, key: jax.Array, chips: ChipMean):
        grad_fn = chips.value_and_grad(loss_fn, has_aux=True)
        observed = trajectory._replace(
            obs=_observe(config, state.obs_stats, trajectory.obs),
            last_obs=_observe(config, state.obs_stats, trajectory.last_obs),
        )
        _, last_value = network.apply(state.params, observed.last_obs)
        rewards, return_stats = trajectory.rewards, state.return_stats
        if config.scale_rewards:
            ended = trajectory.terminated | trajectory.truncated
            returns = forward_returns(rewards, ended, config.gamma)
            return_stats = update_stats(return_stats, returns.reshape(-1), chips,
                                        trajectory.valid.reshape(-1))
            rewards = rewards / jnp.sqrt(return_stats.var + 1e-8)
        advantages, returns = gae(
            rewards,
            trajectory.extras["value"],
            trajectory.terminated,
            trajectory.truncated,
            last_value,
            config.gamma,
            config.gae_lambda,
        )
        batch = flatten(observed, advantages, returns)
        size = batch.obs.shape[0]
        minibatch = size // config.num_minibatches

        def minibatch_step(carry, indices):
            params, opt_state = carry
            sub = jax.tree.map(lambda x: x[indices], batch)
            # NOTE: the one cross-chip collective per minibatch (when chips share the
            # work); every chip then applies the same averaged gradient.
            (_, metrics), grads = grad_fn(params, apply, sub, config)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), metrics

        def epoch(carry, epoch_key):
            order = jax.random.permutation(epoch_key, size)[: minibatch * config.num_minibatches]
            return jax.lax.scan(
                minibatch_step, carry, order.reshape(config.num_minibatches, minibatch)
            )

        keys = jax.random.split(key, config.num_epochs)
        (params, opt_state), metrics = jax.lax.scan(
            epoch, (state.params, state.opt_state), keys
        )
        obs_stats = state.obs_stats
        if config.normalize_observations:
            flat_obs = trajectory.obs.reshape((-1, *trajectory.obs.shape[2:]))
            obs_stats = update_stats(obs_stats, flat_obs, chips, trajectory.valid.reshape(-1))
        return PPOState(params, opt_state, obs_stats, return_stats), \
            jax.tree.map(jnp.mean, metrics)

    return update


def make_act(policy: Policy, config: PPOConfig) -> Callable:
    """``act((params, obs_stats), obs, key) -> (actions, extras)`` for rollouts: extras
    are the behaviour ``log_prob`` and ``value`` (and a continuous policy's ``raw_action``,
    its sample before clipping or squashing)."""

    def act(acting, obs, key):
        params, obs_stats = acting
        out, values = policy.network.apply(params, _observe(config, obs_stats, obs))
        dist = policy.distribution(out)
        sample = dist.sample(key)
        extras = {"log_prob": dist.log_prob(sample), "value": values}
        if policy.continuous:
            extras["raw_action"] = sample
        return policy.to_env(dist, sample), extras

    return act


def make_greedy(policy: Policy, config: PPOConfig) -> Callable:
    """``greedy((params, obs_stats), obs) -> actions``: the mode (for evaluation)."""

    def greedy(acting, obs):
        params, obs_stats = acting
        out, _ = policy.network.apply(params, _observe(config, obs_stats, obs))
        dist = policy.distribution(out)
        return policy.to_env(dist, dist.mode())

    return greedy


def build(
    config: PPOConfig, spaces: Spaces, num_updates: int, loss_fn: LossFn = ppo_loss
) -> Agent:
    """PPO's agent: an actor-critic MLP (categorical or Gaussian policy), Adam, the clipped
    loss, and, when asked, running observation normalisation and reward scaling."""
    policy = make_policy(spaces, config)
    optimizer = make_optimizer(config, num_updates)

    def init(key):
        params = policy.network.init(key, jnp.zeros((1, *spaces.obs_shape), jnp.float32))
        return PPOState(params, optimizer.init(params), init_stats(tuple(spaces.obs_shape)),
                        init_stats(()))

    return Agent(
        init=init,
        policy=lambda state: (state.params, state.obs_stats),
        act=make_act(policy, config),
        greedy=make_greedy(policy, config),
        update=make_update(policy, optimizer, config, loss_fn),
    )
