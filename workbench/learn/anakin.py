"""Anakin mode: JAX environments stepped on the chip, rollout and update in one program.

The Podracer paper's Anakin layout: each chip holds a batch of JAX environments, rolls
them out with the current policy and applies the algorithm's update, all in one compiled
function, keeping chips equal exactly as the actors mode does. There are no rollout actors
and no trajectories crossing processes.

The rollout functions are pure; ``AnakinLearner`` wraps them for the mesh of chips.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from workbench.algos.base import Trajectory
from workbench.learn.compile_cache import load_or_compile
from workbench.learn.learner import AXIS, ChipLearner, LearnerSetup, StepOutcome, to_numpy


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


def make_rollout(env, act: Callable, rollout_length: int) -> Callable:
    """``rollout(policy, carry, key) -> (carry, trajectory, finished_returns)``.

    Steps every env of ``carry`` ``rollout_length`` times with ``act(policy, obs, key) ->
    (actions, extras)``. Resets follow gymnasium's next-step convention, as the rollout
    actors' vector envs do: an env that finished ignores the following action and resets,
    and that step is masked out (``valid``). So the trajectory means the same in both modes
    and the same update applies. ``finished_returns`` is ``[T, N]``: an episode's return on
    the step it ended, NaN elsewhere.
    """
    import jax
    import jax.numpy as jnp

    step_all = jax.vmap(env.step)
    reset_all = jax.vmap(env.reset)

    def choose(done, fresh, stepped):
        def pick(a, b):
            return jnp.where(done.reshape(done.shape + (1,) * (a.ndim - 1)), a, b)

        return jax.tree.map(pick, fresh, stepped)

    def rollout(policy, carry: EnvCarry, key):
        num_envs = carry.done.shape[0]

        def one_step(carry: EnvCarry, step_key):
            act_key, env_key, reset_key = jax.random.split(step_key, 3)
            actions, extras = act(policy, carry.obs, act_key)
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
                obs=carry.obs, actions=actions, rewards=reward, terminated=terminated,
                truncated=truncated, valid=valid, extras=extras,
                last_obs=None,  # one per rollout, not per step: set after the scan
            )
            ended = jnp.where(finished, episode_return, jnp.nan)
            carry = EnvCarry(state, next_obs, finished, jnp.where(finished, 0.0, episode_return))
            return carry, (row, ended)

        carry, (rows, ended) = jax.lax.scan(
            one_step, carry, jax.random.split(key, rollout_length)
        )
        return carry, rows._replace(last_obs=carry.obs), ended

    return rollout


class AnakinLearner(ChipLearner):
    """One chip's learner in Anakin mode: its own JAX envs, rollout and update on the chip.

    In one process it uses the local devices (one CPU device, or a host's chips); run by
    the engine layer as one Ray actor per chip after ``jax.distributed`` has joined the
    slice, its mesh spans every chip.
    """

    env_kind = "jax"

    def __init__(self, setup: LearnerSetup, source=None, *, devices=None,
                 abstract: bool = False) -> None:
        """Build the learner's programs and its chips' envs (see :class:`ChipLearner` for
        ``devices`` and ``abstract``; an abstract learner's envs are shapes on the mesh)."""
        import jax
        from jax.sharding import PartitionSpec as P

        del source  # Anakin mode steps its own envs
        super().__init__(setup, devices=devices, abstract=abstract)
        env = setup.jax_env()
        self.env = env
        self.steps_per_update = setup.envs_per_chip * setup.rollout_length * self.num_chips
        rollout = make_rollout(env, self.agent.act, setup.rollout_length)
        policy_of, chip_update = self.agent.policy, self.chip_update

        def local_step(state, carry, key, requests):
            rollout_key, update_key = jax.random.split(key)
            # ---- rollout: this chip's envs, its own randomness -------------------------
            carry, trajectory, ended = rollout(
                policy_of(state), carry, jax.random.fold_in(rollout_key, jax.lax.axis_index(AXIS))
            )
            # ---- update: the same update as the actors mode ----------------------------
            state, metrics, agreed = chip_update(state, trajectory, update_key, requests)
            return state, carry, metrics, ended, agreed

        self._step = jax.jit(
            jax.shard_map(
                local_step,
                mesh=self.mesh,
                in_specs=(P(), P(AXIS), P(), P(AXIS)),
                out_specs=(P(), P(AXIS), P(), P(None, AXIS), P()),
                # The env's optional chip_typed (workbench.envs.base) can turn it off.
                check_vma=self.check_replication and getattr(env, "chip_typed", True),
            ),
            donate_argnums=(0, 1),
        )
        envs_per_chip = setup.envs_per_chip
        self._make_carry = jax.jit(
            jax.shard_map(
                lambda key: init_envs(
                    env, jax.random.fold_in(key, jax.lax.axis_index(AXIS)), envs_per_chip
                ),
                mesh=self.mesh,
                in_specs=P(),
                out_specs=P(AXIS),
            )
        )
        # Each chip's envs: the run's env key folded with the chip's index. Through the
        # compile cache like the state's initialisation: a few seconds in every rank.
        envs_key = self._replicate(self.keys.envs)
        if abstract:
            self.carry = self._shaped(jax.eval_shape(self._make_carry, envs_key),
                                      self._per_chip)
        else:
            self.carry = load_or_compile(self._trace_envs().lower())(envs_key)

    def programs(self) -> dict:
        """The state's and the envs' initialisation, and the rollout-and-update step."""
        return {"init": self._trace_init, "init_envs": self._trace_envs,
                "update": self._trace_update}

    def _trace_envs(self):
        return self._make_carry.trace(self._replicate(self.keys.envs))

    def _trace_update(self):
        return self._step.trace(self.state, self.carry, self._update_key(),
                                self._requests(False, False))

    def step(self, stop: bool = False, checkpoint: bool = False) -> StepOutcome:
        started = time.perf_counter()
        self.compile()
        self.state, self.carry, metrics, ended, agreed = self._compiled(
            self.state, self.carry, self._update_key(), self._requests(stop, checkpoint)
        )
        self._updates += 1
        ended = to_numpy(ended)
        agreed_stop, agreed_checkpoint = self._agreed(agreed)
        return StepOutcome(
            metrics=self._metrics(metrics),
            stop=agreed_stop,
            checkpoint=agreed_checkpoint,
            step_s=time.perf_counter() - started,
            env_steps=self.steps_per_update,
            episode_returns=tuple(float(r) for r in ended[~np.isnan(ended)]),
            policy_versions=(self._updates - 1,),
        )

    def resume_state(self) -> dict:
        # Every chip's environments, gathered (a collective: all chips call this together).
        import jax
        from jax.experimental import multihost_utils

        return {"carry": jax.tree.leaves(multihost_utils.process_allgather(self.carry,
                                                                            tiled=True))}

    def load_resume_state(self, resume: dict[str, list]) -> bool:
        import jax

        leaves = resume.get("carry")
        template = jax.tree.leaves(self.carry)
        if not leaves or len(leaves) != len(template) or any(
            np.shape(a) != b.shape for a, b in zip(leaves, template, strict=True)
        ):
            return False  # another slice shape: these chips' envs start afresh
        restored = [
            jax.make_array_from_callback(b.shape, b.sharding, lambda index, a=a: a[index])
            for a, b in zip(leaves, template, strict=True)
        ]
        self.carry = jax.tree.unflatten(jax.tree.structure(self.carry), restored)
        return True
