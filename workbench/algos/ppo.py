"""PPO as pure functions on pytrees: the network, GAE, the clipped loss, the update step.

Nothing here knows about Ray, processes or chips. The update takes an optional mesh axis
name; when it is given, gradients and metrics are averaged across that axis, which is how
every chip of a slice ends each update with the same parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree


@dataclass(frozen=True)
class PPOConfig:
    """What PPO learns with; where it runs is configured elsewhere."""

    learning_rate: float = 5e-4
    """Adam step size (linearly annealed to 0 over the run when ``anneal_lr``)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to zero over ``num_updates``."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE's bias-variance trade-off."""
    clip_eps: float = 0.2
    """PPO's ratio clipping range."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    num_epochs: int = 4
    """Passes over each batch."""
    num_minibatches: int = 16
    """Minibatches per epoch; the global minibatch is the global batch over this."""
    normalize_advantages: bool = True
    """Standardise advantages within each minibatch."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the actor and critic MLPs."""


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


class Trajectory(NamedTuple):
    """A time-major rollout ``[T, N, ...]`` from gymnasium vector envs (next-step reset).

    ``valid`` is False on the step where an env that finished on the previous step was
    reset; that step's action was ignored by the env, so it is left out of the loss.
    """

    obs: jax.Array
    actions: jax.Array
    log_probs: jax.Array
    values: jax.Array
    rewards: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    valid: jax.Array
    last_value: jax.Array


class Batch(NamedTuple):
    """Flat per-sample training data."""

    obs: jax.Array
    actions: jax.Array
    log_probs: jax.Array
    advantages: jax.Array
    returns: jax.Array
    valid: jax.Array


class LearnerState(NamedTuple):
    params: Any
    opt_state: Any
    update: jax.Array
    """Number of updates applied so far."""


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


def flatten(trajectory: Trajectory, advantages: jax.Array, returns: jax.Array) -> Batch:
    def merge(x: jax.Array) -> jax.Array:
        return x.reshape((-1,) + x.shape[2:])

    return Batch(
        obs=merge(trajectory.obs),
        actions=merge(trajectory.actions),
        log_probs=merge(trajectory.log_probs),
        advantages=merge(advantages),
        returns=merge(returns),
        valid=merge(trajectory.valid).astype(jnp.float32),
    )


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


LossFn = Callable[[Any, Callable, Batch, PPOConfig], tuple[jax.Array, dict[str, jax.Array]]]


def ppo_loss(
    params: Any, apply_fn: Callable, batch: Batch, config: PPOConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The clipped-surrogate PPO loss with a value loss and an entropy bonus.

    Returns:
        ``(loss, metrics)`` where metrics holds the loss terms, entropy and clip fraction.
    """
    logits, values = apply_fn(params, batch.obs)
    log_probs_all = jax.nn.log_softmax(logits)
    log_probs = jnp.take_along_axis(log_probs_all, batch.actions[:, None], axis=-1)[:, 0]
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
    entropy = masked_mean(-jnp.sum(jnp.exp(log_probs_all) * log_probs_all, axis=-1), mask)
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


def init_state(
    network: nn.Module,
    optimizer: optax.GradientTransformation,
    obs_example: np.ndarray,
    seed: int | jax.Array,
) -> LearnerState:
    params = network.init(jax.random.PRNGKey(seed), jnp.asarray(obs_example[None]))
    return LearnerState(params, optimizer.init(params), jnp.zeros((), jnp.int32))


def make_update(
    network: nn.Module,
    optimizer: optax.GradientTransformation,
    config: PPOConfig,
    loss_fn: LossFn = ppo_loss,
    axis_name: str | None = None,
    gather_batch: bool = False,
) -> Callable[..., tuple[LearnerState, dict]]:
    """Build one PPO update: GAE, then epochs of shuffled minibatch gradient steps.

    Across chips (``axis_name`` set) there are two exact ways to keep every chip's
    parameters equal, differing only in what crosses the interconnect:

    - ``gather_batch=False``: each chip steps through minibatches of its own data and the
      gradient is averaged over chips at every minibatch (one all-reduce each). Compute
      scales with chips; right when a collective costs microseconds (ICI).
    - ``gather_batch=True``: the trajectories of all chips are gathered once per update;
      the first chip runs the minibatch steps over the whole batch, so each gradient is
      the global-minibatch gradient, and sends the new state to the others (two
      collectives per update). Right when a collective costs milliseconds and the network
      is small, as with CPU processes sharing a few cores: the other chips' processes
      leave the cores to the one doing the work.

    Args:
        network: the flax module whose ``apply`` gives ``(logits, values)``.
        optimizer: an optax transformation.
        config: PPO hyperparameters.
        loss_fn: ``loss_fn(params, apply_fn, batch, config) -> (loss, metrics)``; swap in
            your own to change the algorithm.
        axis_name: mesh axis the chips form, or ``None`` for one chip.
        gather_batch: see above; only meaningful with ``axis_name``.

    Returns:
        ``update(state, trajectory, key, stop=None) -> (state, metrics)``, pure and
        jittable. With ``gather_batch`` only the first chip's key is used; otherwise each
        chip's is. ``metrics["stop"]`` is above zero when any chip passed a true ``stop``.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    gather = bool(axis_name) and gather_batch

    def mean_over_chips(tree):
        if not axis_name or gather:
            return tree
        # One all-reduce of a flat vector: across hosts each collective costs a network
        # round trip, so a per-leaf mean would multiply the latency by the leaf count.
        flat, unravel = ravel_pytree(tree)
        return unravel(jax.lax.pmean(flat, axis_name))

    def update(state: LearnerState, trajectory: Trajectory, key: jax.Array, stop=None):
        # NOTE: ``stop`` (this chip's wish to end the run) rides along with the update's
        # own collectives, so agreeing on it costs no extra round trip: it comes back as
        # ``metrics["stop"]``, above zero when any chip asked.
        stop = jnp.asarray(0 if stop is None else stop, jnp.float32).reshape(())
        if not gather:
            return learn(state, trajectory, key, stop)
        # NOTE: the first of the update's two collectives: every chip gets every chip's
        # trajectories (and stop flag), as one flat vector, since on CPU each collective
        # costs milliseconds whatever its size. Only the leader learns; the others wait
        # for the second, which hands them its result, so every chip ends with the same
        # state, bit for bit.
        chips = gather_from_chips((trajectory, stop), axis_name)
        trajectory = Trajectory(
            *[jnp.concatenate([t[i] for t, _ in chips], axis=1) for i in range(8)],
            last_value=jnp.concatenate([t.last_value for t, _ in chips]),
        )
        stop = jnp.max(jnp.stack([s for _, s in chips]))
        leader = jax.lax.axis_index(axis_name) == 0
        shapes = jax.eval_shape(learn, state, trajectory, key, stop)
        result = jax.lax.cond(
            leader,
            lambda: learn(state, trajectory, key, stop),
            lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes),
        )
        # NOTE: the leader's result reaches every chip as the first row of an all-gather,
        # not as a sum with the others' zeros: among four processes sharing two cores, gloo
        # takes about 1 ms for an all-gather and 5 ms for an all-reduce (a ring all-reduce
        # makes twice the hops, each one waiting for a process to be scheduled).
        flat, unravel = ravel_pytree(result)
        return unravel(jax.lax.all_gather(flat, axis_name)[0])

    def learn(state: LearnerState, trajectory: Trajectory, key: jax.Array, stop: jax.Array):
        advantages, returns = gae(
            trajectory.rewards,
            trajectory.values,
            trajectory.terminated,
            trajectory.truncated,
            trajectory.last_value,
            config.gamma,
            config.gae_lambda,
        )
        batch = flatten(trajectory, advantages, returns)
        size = batch.actions.shape[0]
        minibatch = size // config.num_minibatches

        def minibatch_step(carry, indices):
            params, opt_state = carry
            sub = jax.tree.map(lambda x: x[indices], batch)
            differentiate_at = params
            if axis_name and not gather:
                # NOTE: params are the same on every chip, but this chip's gradient is not;
                # without the cast, differentiating replicated params would sum every
                # chip's gradient (per leaf) before the mean below.
                differentiate_at = jax.lax.pcast(params, axis_name, to="varying")
            (_, metrics), grads = grad_fn(differentiate_at, network.apply, sub, config)
            # NOTE: the one cross-chip collective per minibatch; every chip then applies
            # the same averaged gradient, so parameters stay identical everywhere.
            grads = mean_over_chips(grads)
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
        metrics = mean_over_chips({**jax.tree.map(jnp.mean, metrics), "stop": stop})
        return LearnerState(params, opt_state, state.update + 1), metrics

    return update


def gather_from_chips(tree: Any, axis_name: str) -> list[Any]:
    """Every chip's ``tree``, in chip order, on every chip: one all-gather of one flat
    vector, however many leaves the tree has."""
    flat, unravel = ravel_pytree(tree)
    return [unravel(row) for row in jax.lax.all_gather(flat, axis_name)]


def policy_step(
    network: nn.Module,
) -> Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, ...]]:
    """``act(params, obs, key) -> (next_key, actions, log_probs, values)`` for rollouts.

    The key is split inside so that one compiled call does all the work of a step.
    """

    def act(params, obs, key):
        key, sample_key = jax.random.split(key)
        logits, values = network.apply(params, obs)
        actions = jax.random.categorical(sample_key, logits)
        log_probs = jnp.take_along_axis(
            jax.nn.log_softmax(logits), actions[:, None], axis=-1
        )[:, 0]
        return key, actions, log_probs, values

    return act


def greedy_step(network: nn.Module) -> Callable[[Any, jax.Array], jax.Array]:
    """``act(params, obs) -> actions`` taking the most likely action (for evaluation)."""

    def act(params, obs):
        logits, _ = network.apply(params, obs)
        return jnp.argmax(logits, axis=-1)

    return act
