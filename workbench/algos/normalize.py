"""Running statistics for normalising observations and scaling rewards, as pure functions.

The statistics live in the learner state, so they are checkpointed with it, and every chip
holds the same: a batch's moments are averaged over the chips that learn together (the
:class:`~workbench.algos.base.ChipMean` the update is handed) before they are folded in.
:class:`~workbench.algos.base.RunningStats` itself lives in the JAX-free protocol module:
a policy holds it, and a kernel reading a run's policy back should not import JAX for it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from workbench.algos.base import ChipMean, RunningStats


def init_stats(shape: tuple[int, ...]) -> RunningStats:
    return RunningStats(jnp.asarray(1e-4, jnp.float32), jnp.zeros(shape, jnp.float32),
                        jnp.ones(shape, jnp.float32))


def update_stats(stats: RunningStats, batch: jax.Array, chips: ChipMean,
                 mask: jax.Array | None = None) -> RunningStats:
    """``stats`` with the rows of ``batch`` ``[B, *shape]`` (where ``mask`` is true) of
    every chip folded in (Chan et al.'s parallel update of a mean and a variance)."""
    weights = jnp.ones(batch.shape[0], jnp.float32) if mask is None else mask.astype(jnp.float32)
    w = weights.reshape((-1,) + (1,) * (batch.ndim - 1))
    local_n = jnp.sum(weights)
    local_sum = jnp.sum(batch * w, axis=0)
    local_sq = jnp.sum(batch**2 * w, axis=0)
    n, total, total_sq = chips.sum((local_n, local_sum, local_sq))
    n = jnp.maximum(n, 1.0)
    batch_mean = total / n
    batch_var = jnp.maximum(total_sq / n - batch_mean**2, 0.0)
    count = stats.count + n
    delta = batch_mean - stats.mean
    mean = stats.mean + delta * n / count
    m2 = stats.var * stats.count + batch_var * n + delta**2 * stats.count * n / count
    return RunningStats(count, mean, m2 / count)


def normalize(stats: RunningStats, x: jax.Array, clip: float = 10.0) -> jax.Array:
    return jnp.clip((x - stats.mean) / jnp.sqrt(stats.var + 1e-8), -clip, clip)


def forward_returns(rewards: jax.Array, done: jax.Array, gamma: float) -> jax.Array:
    """Discounted returns accumulated forward through a rollout ``[T, N]`` from zero at
    its start, reset where an episode ended: what reward scaling takes the spread of
    (each rollout starts afresh, a close approximation for rollouts of tens of steps)."""
    def step(carry, inputs):
        reward, ended = inputs
        carry = carry * gamma + reward
        return jnp.where(ended, 0.0, carry), carry

    _, returns = jax.lax.scan(step, jnp.zeros_like(rewards[0]), (rewards, done))
    return returns
