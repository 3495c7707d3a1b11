"""The two action distributions policies here use, as small pure values.

distrax has these (and the tests check these against it), but it imports TensorFlow
Probability's JAX substrate, which every learner and rollout process would then load at
start-up for a log-probability and an entropy; see the note in ``tests/test_algorithms.py``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

LOG_2PI = math.log(2 * math.pi)


class Categorical(NamedTuple):
    """A categorical distribution over the last axis of ``logits``."""

    logits: jax.Array

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.categorical(key, self.logits)

    def log_prob(self, actions: jax.Array) -> jax.Array:
        log_probs = jax.nn.log_softmax(self.logits)
        return jnp.take_along_axis(log_probs, actions[..., None].astype(jnp.int32), -1)[..., 0]

    def entropy(self) -> jax.Array:
        log_probs = jax.nn.log_softmax(self.logits)
        return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)

    def mode(self) -> jax.Array:
        return jnp.argmax(self.logits, axis=-1)


class DiagGaussian(NamedTuple):
    """A Gaussian with a diagonal covariance over the last axis."""

    mean: jax.Array
    log_std: jax.Array

    def sample(self, key: jax.Array) -> jax.Array:
        return self.mean + jnp.exp(self.log_std) * jax.random.normal(key, self.mean.shape)

    def log_prob(self, x: jax.Array) -> jax.Array:
        z = (x - self.mean) * jnp.exp(-self.log_std)
        return jnp.sum(-0.5 * z**2 - self.log_std - 0.5 * LOG_2PI, axis=-1)

    def entropy(self) -> jax.Array:
        log_std = jnp.broadcast_to(self.log_std, self.mean.shape)
        return jnp.sum(log_std + 0.5 * (1.0 + LOG_2PI), axis=-1)

    def mode(self) -> jax.Array:
        return self.mean


def squash(raw: jax.Array, low: jax.Array, high: jax.Array) -> jax.Array:
    """A Gaussian sample mapped into ``[low, high]`` through ``tanh``."""
    return low + (jnp.tanh(raw) + 1.0) * 0.5 * (high - low)


def squash_log_det(raw: jax.Array, low: jax.Array, high: jax.Array) -> jax.Array:
    """``log |d squash / d raw|`` summed over the action's components: what a squashed
    sample's log-probability loses against the Gaussian's. Written with softplus for the
    stability of ``log(1 - tanh(x)^2)`` at large ``|x|``."""
    log_one_minus_tanh2 = 2.0 * (math.log(2.0) - raw - jax.nn.softplus(-2.0 * raw))
    return jnp.sum(log_one_minus_tanh2 + jnp.log(0.5 * (high - low)), axis=-1)


class SquashedGaussian(NamedTuple):
    """A Gaussian over raw samples whose actions are ``squash(raw, low, high)``: densities
    are of the action, so each log-probability carries the squash's correction."""

    mean: jax.Array
    log_std: jax.Array
    low: jax.Array
    high: jax.Array

    def sample(self, key: jax.Array) -> jax.Array:
        """A raw sample (map it with :meth:`to_action`)."""
        return DiagGaussian(self.mean, self.log_std).sample(key)

    def log_prob(self, raw: jax.Array) -> jax.Array:
        return DiagGaussian(self.mean, self.log_std).log_prob(raw) - \
            squash_log_det(raw, self.low, self.high)

    def entropy(self) -> jax.Array:
        # The Gaussian's: the squashed one has no closed form, and as a bonus term the
        # Gaussian's keeps the same pull towards exploring.
        return DiagGaussian(self.mean, self.log_std).entropy()

    def mode(self) -> jax.Array:
        return self.mean

    def to_action(self, raw: jax.Array) -> jax.Array:
        return squash(raw, self.low, self.high)
