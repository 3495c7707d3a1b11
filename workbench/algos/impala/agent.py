"""IMPALA as pure functions on pytrees: V-trace targets, the actor-critic loss, acting.
Nothing here knows about Ray, processes or chips."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from workbench.algos.base import Agent, ChipMean, Spaces, Trajectory
from workbench.algos.impala.config import IMPALAConfig
from workbench.algos.policies import Policy, make_policy


class IMPALAState(NamedTuple):
    params: Any
    opt_state: Any


class VTrace(NamedTuple):
    vs: jax.Array
    """Value targets ``[T, N]``."""
    pg_advantages: jax.Array
    """Advantages for the policy gradient ``[T, N]`` (importance weighted and clipped)."""


def vtrace(
    values: jax.Array,
    last_value: jax.Array,
    rewards: jax.Array,
    discounts: jax.Array,
    log_rhos: jax.Array,
    *,
    lambda_: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float = 1.0,
) -> VTrace:
    """V-trace targets (Espeholt et al., 2018, eq. 1) for time-major ``[T, N]`` arrays.

    Args:
        values: ``V(x_t)`` under the current value function.
        last_value: ``V(x_T)``, the bootstrap after the last step.
        rewards: ``r_t``.
        discounts: ``gamma`` where step ``t`` continues into ``t + 1``, 0 where it ends the
            trace (termination, or a step whose successor is another episode's).
        log_rhos: log importance weights, target minus behaviour log-probability.
        lambda_, rho_bar, c_bar, pg_rho_bar: the paper's lambda and clips.

    Returns:
        The value targets and the policy-gradient advantages; neither carries gradients.
    """
    rhos = jnp.exp(log_rhos)
    clipped_rhos = jnp.minimum(rho_bar, rhos)
    cs = lambda_ * jnp.minimum(c_bar, rhos)
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    deltas = clipped_rhos * (rewards + discounts * next_values - values)

    def step(carry, inputs):
        delta, discount, c = inputs
        carry = delta + discount * c * carry
        return carry, carry

    _, corrections = jax.lax.scan(step, jnp.zeros_like(last_value), (deltas, discounts, cs),
                                  reverse=True)
    vs = corrections + values
    # The policy gradient bootstraps from the next step's target, mixed with its value by
    # lambda as rlax does (the paper's vs_{t+1} at lambda = 1).
    next_vs = jnp.concatenate([lambda_ * vs[1:] + (1 - lambda_) * values[1:], last_value[None]],
                              axis=0)
    pg_advantages = jnp.minimum(pg_rho_bar, rhos) * (rewards + discounts * next_vs - values)
    return VTrace(jax.lax.stop_gradient(vs), jax.lax.stop_gradient(pg_advantages))


def trace_discounts(trajectory: Trajectory, gamma: float) -> jax.Array:
    """``gamma`` where a step continues its episode into the next, else 0.

    With next-step autoreset a truncated step's successor holds the episode's final
    observation (the env's reset step), so it still bootstraps, but from a step whose own
    weight is zeroed (see :func:`vtrace_inputs`) and which cuts its trace onwards."""
    ends = trajectory.terminated | ~trajectory.valid
    return gamma * (1.0 - ends.astype(jnp.float32))


def make_update(policy: Policy, optimizer: optax.GradientTransformation,
                config: IMPALAConfig) -> Callable:
    """``update(state, trajectory, key, chips) -> (state, metrics)``."""
    network = policy.network

    def loss_fn(params, trajectory: Trajectory, last_obs):
        T, N = trajectory.rewards.shape
        flat_obs = trajectory.obs.reshape((T * N, *trajectory.obs.shape[2:]))
        out, values = network.apply(params, flat_obs)
        dist = policy.distribution(jax.tree.map(lambda x: x.reshape((T, N, *x.shape[1:])), out))
        values = values.reshape(T, N)
        _, last_value = network.apply(params, last_obs)
        actions = trajectory.extras.get("raw_action", trajectory.actions)
        log_probs = dist.log_prob(actions)
        valid = trajectory.valid.astype(jnp.float32)
        # NOTE: a reset step (an action the env ignored) gets no weight: its "transition"
        # belongs to no episode; its value is then its own target, the final observation's.
        log_rhos = jnp.where(trajectory.valid, log_probs - trajectory.extras["log_prob"],
                             -jnp.inf)
        targets = vtrace(values, last_value, trajectory.rewards,
                         trace_discounts(trajectory, config.gamma),
                         jax.lax.stop_gradient(log_rhos), lambda_=config.vtrace_lambda,
                         rho_bar=config.rho_bar, c_bar=config.c_bar,
                         pg_rho_bar=config.pg_rho_bar)
        count = jnp.maximum(jnp.sum(valid), 1.0)
        policy_loss = -jnp.sum(log_probs * targets.pg_advantages * valid) / count
        value_loss = 0.5 * jnp.sum((targets.vs - values) ** 2 * valid) / count
        entropy = jnp.sum(dist.entropy() * valid) / count
        loss = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
        return loss, {"loss": loss, "policy_loss": policy_loss, "value_loss": value_loss,
                      "entropy": entropy,
                      "importance_weight": jnp.sum(jnp.exp(log_rhos) * valid) / count}

    def update(state: IMPALAState, trajectory: Trajectory, key: jax.Array, chips: ChipMean):
        grad_fn = chips.value_and_grad(loss_fn, has_aux=True)
        N = trajectory.rewards.shape[1]
        minibatches = min(config.num_minibatches, N)  # whole envs per minibatch
        width = N // minibatches

        def minibatch_step(carry, columns):
            params, opt_state = carry
            part = jax.tree.map(lambda x: jnp.take(x, columns, axis=1),
                                trajectory._replace(last_obs=None))
            (_, metrics), grads = grad_fn(params, part, jnp.take(trajectory.last_obs, columns,
                                                                  axis=0))
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), metrics

        def epoch(carry, epoch_key):
            # Whole trajectories per minibatch: V-trace runs along time.
            order = jax.random.permutation(epoch_key, N)[: width * minibatches]
            return jax.lax.scan(minibatch_step, carry, order.reshape(minibatches, width))

        (params, opt_state), metrics = jax.lax.scan(
            epoch, (state.params, state.opt_state), jax.random.split(key, config.num_epochs))
        return IMPALAState(params, opt_state), jax.tree.map(jnp.mean, metrics)

    return update


def build(config: IMPALAConfig, spaces: Spaces, num_updates: int) -> Agent:
    """IMPALA's agent: the actor-critic of PPO's policies, Adam, V-trace."""
    policy = make_policy(spaces, config)
    steps = max(1, num_updates * config.num_epochs * config.num_minibatches)
    learning_rate = (optax.linear_schedule(config.learning_rate, 0.0, steps)
                     if config.anneal_lr else config.learning_rate)
    optimizer = optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                            optax.adam(learning_rate, eps=1e-5))

    def init(key):
        params = policy.network.init(key, jnp.zeros((1, *spaces.obs_shape), jnp.float32))
        return IMPALAState(params, optimizer.init(params))

    def act(params, obs, key):
        out, values = policy.network.apply(params, obs)
        dist = policy.distribution(out)
        sample = dist.sample(key)
        extras = {"log_prob": dist.log_prob(sample), "value": values}
        if policy.continuous:
            extras["raw_action"] = sample
        return policy.to_env(dist, sample), extras

    def greedy(params, obs):
        out, _ = policy.network.apply(params, obs)
        dist = policy.distribution(out)
        return policy.to_env(dist, dist.mode())

    return Agent(init=init, policy=lambda state: state.params, act=act, greedy=greedy,
                 update=make_update(policy, optimizer, config))
