"""Anakin mode: JAX environments stepped on the chip, rollout and update in one program.

The Podracer paper's Anakin layout: each chip holds a batch of JAX environments, rolls
them out with the current policy, computes advantages and applies the PPO update, all in
one compiled function, and averages across chips exactly as the actors mode does. There
are no rollout actors and no trajectories crossing processes.

The rollout functions are pure; ``AnakinLearner`` wraps them for the mesh of chips. The
PPO math is the one in :mod:`workbench.algos.ppo`, shared with the actors mode.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from workbench.algos.ppo import LossFn, PPOConfig, Trajectory, ppo_loss
from workbench.compile_cache import load_or_compile
from workbench.learner import AXIS, MeshLearner, UpdateResult, to_numpy


class EnvCarry(NamedTuple):
    """A batch of environments between steps (leading axis: env)."""

    state: Any
    obs: Any
    done: Any
    """True where the env finished on the last step and resets on the next one."""
    episode_return: Any


def init_envs(env, key, num_envs: int) -> EnvCarry:
    """Reset ``num_envs`` copies of the JAX env ``env``."""
    import jax
    import jax.numpy as jnp

    state, obs = jax.vmap(env.reset)(jax.random.split(key, num_envs))
    return EnvCarry(state, obs, jnp.zeros(num_envs, bool), jnp.zeros(num_envs, jnp.float32))


def make_rollout(env, network, rollout_length: int) -> Callable:
    """``rollout(params, carry, key) -> (carry, trajectory, finished_returns)``.

    Steps every env of ``carry`` ``rollout_length`` times with the sampling policy. Resets
    follow gymnasium's next-step convention, as the rollout actors' vector envs do: an env
    that finished ignores the following action and resets, and that step is masked out
    of the loss (``valid``) but keeps its value, the bootstrap of a truncated episode. So
    the trajectory means the same in both modes and the same GAE and loss apply.
    ``finished_returns`` is ``[T, N]``: an episode's return on the step it ended, NaN
    elsewhere.
    """
    import jax
    import jax.numpy as jnp

    from workbench.algos.ppo import policy_step

    act = policy_step(network)
    step_all = jax.vmap(env.step)
    reset_all = jax.vmap(env.reset)

    def choose(done, fresh, stepped):
        def pick(a, b):
            return jnp.where(done.reshape(done.shape + (1,) * (a.ndim - 1)), a, b)

        return jax.tree.map(pick, fresh, stepped)

    def rollout(params, carry: EnvCarry, key):
        num_envs = carry.done.shape[0]

        def one_step(carry: EnvCarry, step_key):
            act_key, env_key, reset_key = jax.random.split(step_key, 3)
            _, actions, log_probs, values = act(params, carry.obs, act_key)
            # Both branches are computed for every env; for small envs that is cheaper
            # than any control flow, and it keeps the step a straight-line program.
            stepped = step_all(carry.state, actions, jax.random.split(env_key, num_envs))
            fresh_state, fresh_obs = reset_all(jax.random.split(reset_key, num_envs))
            valid = ~carry.done
            state = choose(carry.done, fresh_state, stepped[0])
            next_obs = choose(carry.done, fresh_obs, stepped[1])
            reward = jnp.where(valid, stepped[2], 0.0).astype(jnp.float32)
            terminated = stepped[3] & valid
            truncated = stepped[4] & valid
            finished = terminated | truncated
            episode_return = carry.episode_return + reward
            row = Trajectory(
                obs=carry.obs,
                actions=actions,
                log_probs=log_probs,
                values=values,
                rewards=reward,
                terminated=terminated,
                truncated=truncated,
                valid=valid,
                last_value=(),  # one per rollout, not per step: set after the scan
            )
            ended = jnp.where(finished, episode_return, jnp.nan)
            carry = EnvCarry(state, next_obs, finished, jnp.where(finished, 0.0, episode_return))
            return carry, (row, ended)

        carry, (rows, ended) = jax.lax.scan(
            one_step, carry, jax.random.split(key, rollout_length)
        )
        _, last_value = network.apply(params, carry.obs)
        return carry, rows._replace(last_value=last_value), ended

    return rollout


def make_greedy_evaluation(env, network) -> Callable:
    """``evaluate(params, key, episodes) -> returns[episodes]``: one episode on each of
    ``episodes`` fresh copies of the JAX env ``env`` with the greedy policy, as one program
    (jit it with ``static_argnames="episodes"``).

    Runs ``env.max_episode_steps`` steps, by which every episode has ended; an episode's
    return stops counting on the step it ended. A greedy evaluation stepped from Python
    costs a dispatch per step, and the engine evaluates often enough for that to take a
    core away from the learners.
    """
    import jax
    import jax.numpy as jnp

    from workbench.algos.ppo import greedy_step

    act = greedy_step(network)
    step_all = jax.vmap(env.step)

    def evaluate(params, key, episodes: int):
        reset_key, step_key = jax.random.split(key)
        state, obs = jax.vmap(env.reset)(jax.random.split(reset_key, episodes))

        def one_step(carry, step_key):
            state, obs, running, total = carry
            state, obs, reward, terminated, truncated = step_all(
                state, act(params, obs), jax.random.split(step_key, episodes)
            )
            total = total + jnp.where(running, reward, 0.0)
            return (state, obs, running & ~(terminated | truncated), total), None

        start = (state, obs, jnp.ones(episodes, bool), jnp.zeros(episodes, jnp.float32))
        (_, _, _, total), _ = jax.lax.scan(
            one_step, start, jax.random.split(step_key, env.max_episode_steps)
        )
        return total

    return evaluate


class AnakinLearner(MeshLearner):
    """One chip's learner in Anakin mode: its own envs, rollout and update on the chip.

    In one process it uses the local devices (one CPU device, or a host's chips); run by
    the engine as one Ray actor per chip after ``jax.distributed`` has joined the slice,
    its mesh spans every chip and each update averages across all of them.
    """

    def __init__(
        self,
        env,
        envs_per_chip: int,
        rollout_length: int,
        config: PPOConfig,
        num_updates: int,
        seed: int,
        loss_fn: LossFn = ppo_loss,
        gather_batch: bool = False,
    ) -> None:
        import jax
        from jax.sharding import PartitionSpec as P

        super().__init__(seed)
        self.env = env
        self.steps_per_update = envs_per_chip * rollout_length * self.num_chips
        update = self._setup_ppo(
            np.zeros(env.observation_shape, np.float32), env.num_actions, config, num_updates,
            loss_fn, gather_batch,
        )
        rollout = make_rollout(env, self.network, rollout_length)

        def local_step(state, carry, key, stop):
            rollout_key, update_key = jax.random.split(key)
            # ---- rollout: this chip's envs, its own randomness -------------------------
            carry, trajectory, ended = rollout(
                state.params, carry, jax.random.fold_in(rollout_key, jax.lax.axis_index(AXIS))
            )
            # ---- update: the same PPO step as the actors mode --------------------------
            state, metrics, any_stop = update(state, trajectory, update_key, stop)
            return state, carry, metrics, ended, any_stop

        self._step = jax.jit(
            jax.shard_map(
                local_step,
                mesh=self.mesh,
                in_specs=(P(), P(AXIS), P(), P(AXIS)),
                out_specs=(P(), P(AXIS), P(), P(None, AXIS), P()),
                # As in the actors mode: equality after a gathered batch is checked by the
                # tests' state digests, not statically.
                check_vma=not gather_batch,
            ),
            donate_argnums=(0, 1),
        )
        self._compiled = None
        make_carry = jax.jit(
            jax.shard_map(
                lambda key: init_envs(
                    env, jax.random.fold_in(key, jax.lax.axis_index(AXIS)), envs_per_chip
                ),
                mesh=self.mesh,
                in_specs=P(),
                out_specs=P(AXIS),
            )
        )
        self.carry = make_carry(self._replicate(np.asarray(
            jax.random.key_data(jax.random.fold_in(jax.random.PRNGKey(seed), 1_000_003))
        )))

    def compile(self) -> float:
        """Compile the step ahead of the first update; returns the seconds it took."""
        started = time.perf_counter()
        if self._compiled is None:
            self._compiled = load_or_compile(self._step.lower(
                self.state, self.carry, self._update_key(), self._stop_flag(False)
            ))
        return time.perf_counter() - started

    def step(self, stop: bool = False) -> UpdateResult:
        """Roll out every env of this chip and apply one update; all chips call it together."""
        started = time.perf_counter()
        self.compile()
        self.state, self.carry, metrics, ended, any_stop = self._compiled(
            self.state, self.carry, self._update_key(), self._stop_flag(stop)
        )
        self._updates += 1
        metrics = {k: float(v) for k, v in to_numpy(metrics).items()}
        ended = to_numpy(ended)
        returns = tuple(float(r) for r in ended[~np.isnan(ended)])
        return UpdateResult(
            metrics, bool(to_numpy(any_stop)), time.perf_counter() - started, returns
        )
