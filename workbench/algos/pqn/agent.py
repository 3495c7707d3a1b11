"""PQN as pure functions on pytrees: Q(lambda) targets, the regression update, epsilon-greedy
acting. Nothing here knows about Ray, processes or chips."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from workbench.algos.base import Agent, ChipMean, Spaces, Trajectory
from workbench.algos.networks import QNetwork
from workbench.algos.pqn.config import PQNConfig


class PQNState(NamedTuple):
    params: Any
    opt_state: Any
    update: jax.Array
    """Updates applied so far: where the epsilon schedule is."""


def epsilon(config: PQNConfig, update: jax.Array, num_updates: int) -> jax.Array:
    """The behaviour policy's exploration rate after ``update`` updates (linear decay)."""
    span = jnp.maximum(config.epsilon_decay_fraction * num_updates, 1.0)
    fraction = jnp.clip(update / span, 0.0, 1.0)
    return config.epsilon_start + fraction * (config.epsilon_end - config.epsilon_start)


def q_lambda_returns(
    rewards: jax.Array,
    next_max_q: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    gamma: float,
    q_lambda: float,
) -> jax.Array:
    """Q(lambda) targets for ``[T, N]`` arrays, computed backwards.

    ``next_max_q[t]`` is ``max_a Q(s_{t+1}, a)``. A terminated step does not bootstrap; a
    truncated one bootstraps fully from ``next_max_q`` (with next-step reset, ``s_{t+1}`` is
    the final observation) and ends the lambda trace, as does termination, so targets never
    mix episodes.
    """
    not_terminated = 1.0 - terminated.astype(jnp.float32)
    cut = (terminated | truncated).astype(jnp.float32)

    def step(carry, inputs):
        reward, next_q, keep, ended = inputs
        blended = (1.0 - q_lambda) * next_q + q_lambda * carry
        target = reward + gamma * keep * jnp.where(ended > 0, next_q, blended)
        return target, target

    _, targets = jax.lax.scan(step, next_max_q[-1], (rewards, next_max_q, not_terminated, cut),
                              reverse=True)
    return targets


def make_update(network: QNetwork, optimizer: optax.GradientTransformation,
                config: PQNConfig) -> Callable:
    """``update(state, trajectory, key, chips) -> (state, metrics)``: Q(lambda) targets
    from the current network, then epochs of shuffled minibatch regression steps."""

    def q_loss(params, obs, actions, targets, mask):
        q = network.apply(params, obs)
        taken = jnp.take_along_axis(q, actions[:, None].astype(jnp.int32), -1)[:, 0]
        error = taken - targets
        loss = 0.5 * jnp.sum(error**2 * mask) / jnp.maximum(jnp.sum(mask), 1.0)
        return loss, {"loss": loss, "q_mean": jnp.sum(taken * mask) / jnp.maximum(
            jnp.sum(mask), 1.0)}

    def update(state: PQNState, trajectory: Trajectory, key: jax.Array, chips: ChipMean):
        grad_fn = chips.value_and_grad(q_loss, has_aux=True)
        T, N = trajectory.rewards.shape
        following = jnp.concatenate([trajectory.obs[1:], trajectory.last_obs[None]], axis=0)
        next_q = network.apply(state.params, following.reshape((T * N, *following.shape[2:])))
        next_max_q = jnp.max(next_q, axis=-1).reshape(T, N)
        targets = q_lambda_returns(trajectory.rewards, next_max_q, trajectory.terminated,
                                   trajectory.truncated, config.gamma, config.q_lambda)
        obs = trajectory.obs.reshape((T * N, *trajectory.obs.shape[2:]))
        actions = trajectory.actions.reshape(-1)
        targets, mask = targets.reshape(-1), trajectory.valid.reshape(-1).astype(jnp.float32)
        size = T * N
        minibatch = size // config.num_minibatches

        def minibatch_step(carry, indices):
            params, opt_state = carry
            (_, metrics), grads = grad_fn(params, obs[indices], actions[indices],
                                          targets[indices], mask[indices])
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), metrics

        def epoch(carry, epoch_key):
            order = jax.random.permutation(epoch_key, size)[: minibatch * config.num_minibatches]
            return jax.lax.scan(minibatch_step, carry,
                                order.reshape(config.num_minibatches, minibatch))

        (params, opt_state), metrics = jax.lax.scan(
            epoch, (state.params, state.opt_state), jax.random.split(key, config.num_epochs))
        metrics = jax.tree.map(jnp.mean, metrics)
        return PQNState(params, opt_state, state.update + 1), metrics

    return update


def build(config: PQNConfig, spaces: Spaces, num_updates: int) -> Agent:
    """PQN's agent: a LayerNorm Q-network, Adam, epsilon-greedy acting."""
    network = QNetwork(spaces.num_actions, tuple(config.hidden_sizes), config.activation,
                       config.layer_norm)
    steps = max(1, num_updates * config.num_epochs * config.num_minibatches)
    learning_rate = (optax.linear_schedule(config.learning_rate, 0.0, steps)
                     if config.anneal_lr else config.learning_rate)
    optimizer = optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                            optax.adam(learning_rate))

    def init(key):
        params = network.init(key, jnp.zeros((1, *spaces.obs_shape), jnp.float32))
        return PQNState(params, optimizer.init(params), jnp.zeros((), jnp.int32))

    def policy(state):
        return state.params, epsilon(config, state.update, num_updates)

    def act(acting, obs, key):
        params, eps = acting
        q = network.apply(params, obs)
        explore_key, choice_key = jax.random.split(key)
        random_actions = jax.random.randint(choice_key, q.shape[:1], 0, q.shape[-1])
        explore = jax.random.uniform(explore_key, q.shape[:1]) < eps
        return jnp.where(explore, random_actions, jnp.argmax(q, axis=-1)), {}

    def greedy(acting, obs):
        params, _ = acting
        return jnp.argmax(network.apply(params, obs), axis=-1)

    return Agent(init=init, policy=policy, act=act, greedy=greedy,
                 update=make_update(network, optimizer, config))
