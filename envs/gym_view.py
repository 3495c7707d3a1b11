"""Gymnasium views of the JAX environments: one env (``gymnasium.make``) and a batch of envs
stepped by one compiled, vmapped call (``gymnasium.make_vec``).

Both hold their own PRNG keys and run on the CPU. The compiled functions are cached per
environment value, so every view of the same environment in a process shares one compile.

Gymnasium's own ``FunctionalJaxEnv``/``FunctionalJaxVectorEnv`` wrap a different protocol
(``FuncEnv``) and dispatch a step's operations one by one, read the done flags to the host
every step, leave a reset env's reward from its stale state and keep the state as one array;
these views are one jitted call per step with exact next-step autoreset, 33x the steps/s of
gymnasium's ``phys2d/CartPole-v1`` at 64 envs (``benchmarks/bench_gym_view.py``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from workbench.envs.base import JaxEnv
from workbench.envs.registry import make_jax


class CompiledEnv(NamedTuple):
    """Jitted functions of one environment; each splits the key it is given once."""

    reset: Callable
    """``key -> (key, state, obs)``"""
    step: Callable
    """``(key, state, action) -> (key, state, obs, reward, terminated, truncated)``"""
    reset_batch: Callable
    """``reset`` vmapped over a batch of keys."""
    step_batch: Callable
    """``(keys, states, done, actions) -> (keys, states, obs, rewards, terms, truncs)``:
    envs whose episode ended on the previous step reset instead (next-step autoreset)."""


@functools.cache
def compiled(env: JaxEnv) -> CompiledEnv:
    """The jitted functions of ``env``, built once per process for each environment value.

    Args:
        env: a JAX environment (hashable: equal environments share the functions).

    Returns:
        The jitted single and batched reset and step.
    """

    def reset(key):
        key, sub = jax.random.split(key)
        state, obs = env.reset(sub)
        return key, state, obs

    def step(key, state, action):
        key, sub = jax.random.split(key)
        return (key, *env.step(state, action, sub))

    def autoreset_step(key, state, done, action):
        # NOTE: a finished env uses the same key split as a single env's reset() would, so
        # the batch replays exactly what a loop over single envs does.
        key, sub = jax.random.split(key)
        stepped, obs, reward, terminated, truncated = env.step(state, action, sub)
        fresh, fresh_obs = env.reset(sub)
        state = jax.tree.map(lambda a, b: jnp.where(done, a, b), fresh, stepped)
        return (
            key,
            state,
            jnp.where(done, fresh_obs, obs),
            jnp.where(done, 0.0, reward).astype(jnp.float32),
            terminated & ~done,
            truncated & ~done,
        )

    return CompiledEnv(
        reset=jax.jit(reset),
        step=jax.jit(step),
        reset_batch=jax.jit(jax.vmap(reset)),
        step_batch=jax.jit(jax.vmap(autoreset_step)),
    )


@functools.cache
def _cpu() -> jax.Device:
    return jax.local_devices(backend="cpu")[0]


def _key_data(seeds: Sequence[int]) -> np.ndarray:
    """Raw threefry key data, one row per seed; any non-negative integer seed works."""
    return np.stack(
        [np.random.SeedSequence(int(s)).generate_state(2, dtype=np.uint32) for s in seeds]
    )


def _wrap_keys(data: np.ndarray) -> jax.Array:
    """PRNG keys from raw key data, placed on the CPU so the jitted functions run there."""
    with jax.default_device(_cpu()):
        return jax.device_put(jax.random.wrap_key_data(data, impl="threefry2x32"), _cpu())


def _jax_env(env_id: str, entry: Any, env_kwargs: dict) -> JaxEnv:
    # A user's environment carries its registry entry in the gymnasium spec, so that a
    # process where it was never registered (a rollout actor) can still build it.
    if entry is not None:
        return entry.with_kwargs(**env_kwargs).make() if env_kwargs else entry.make()
    return make_jax(env_id, **env_kwargs)


def _observation_space(env: JaxEnv) -> gym.spaces.Box:
    low, high = getattr(env, "observation_bounds", (-np.inf, np.inf))
    return gym.spaces.Box(low, high, shape=tuple(env.observation_shape), dtype=np.float32)


def _check_render_mode(render_mode: str | None) -> None:
    if render_mode not in (None, "rgb_array"):
        raise ValueError(
            f"render_mode={render_mode!r} was asked; the workbench environments render "
            "only 'rgb_array' (or None)."
        )


def _check_options(options: dict[str, Any] | None) -> None:
    if options:
        raise ValueError(
            f"reset(options={options!r}) was asked; the workbench environments take no "
            "reset options. Pass environment parameters to gymnasium.make instead."
        )


class JaxGymEnv(gym.Env):
    """A gymnasium env stepping one JAX environment with jitted functions.

    Args:
        env_id: one of :func:`workbench.envs.jax_env_ids`.
        render_mode: ``"rgb_array"`` or None.
        **env_kwargs: the environment's parameters (e.g. ``size=20`` for DeepSea).

    Raises:
        ValueError: an unknown id or parameter, or a render mode other than ``"rgb_array"``.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, env_id: str, render_mode: str | None = None, entry: Any = None,
                 **env_kwargs: Any) -> None:
        _check_render_mode(render_mode)
        self.jax_env = _jax_env(env_id, entry, env_kwargs)
        self.render_mode = render_mode
        self.metadata = {
            **type(self).metadata,
            "render_fps": getattr(self.jax_env, "render_fps", 30),
        }
        self.observation_space = _observation_space(self.jax_env)
        self.action_space = gym.spaces.Discrete(self.jax_env.num_actions)
        self._fns = compiled(self.jax_env)
        self._key: jax.Array | None = None
        self._state: Any = None
        self._done = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        _check_options(options)
        super().reset(seed=seed)
        if seed is not None or self._key is None:
            # A reset without a seed continues this env's own key sequence.
            first = seed if seed is not None else int(self.np_random.integers(2**63))
            self._key = _wrap_keys(_key_data([first]))[0]
        self._key, self._state, obs = self._fns.reset(self._key)
        self._done = False
        return np.array(obs), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise gym.error.ResetNeeded(
                "step() was called on a finished (or never started) episode; call reset() "
                "first."
            )
        if not self.action_space.contains(action):
            raise ValueError(
                f"Action {action!r} is not valid for {self.jax_env.id}: use an integer in "
                f"0..{self.jax_env.num_actions - 1}."
            )
        self._key, self._state, *out = self._fns.step(
            self._key, self._state, np.int32(action)
        )
        obs, reward, terminated, truncated = jax.device_get(out)
        self._done = bool(terminated or truncated)
        return np.array(obs), float(reward), bool(terminated), bool(truncated), {}

    def render(self) -> np.ndarray | None:
        if self.render_mode is None:
            gym.logger.warn(
                "render() was called without a render mode; make the env with "
                f'gymnasium.make("{self.jax_env.id}", render_mode="rgb_array").'
            )
            return None
        if self._state is None:
            return None
        return self.jax_env.render(jax.device_get(self._state))


class JaxVectorEnv(VectorEnv):
    """A batch of one JAX environment, stepped by a single jitted, vmapped call.

    Autoreset is next-step (gymnasium's default, and what the rollout workers expect): the
    step after an episode ends ignores that env's action and returns its reset observation
    with reward 0. Env ``i`` behaves exactly like a :class:`JaxGymEnv` reset with seed
    ``seed + i``.

    Args:
        num_envs: how many environments.
        env_id: one of :func:`workbench.envs.jax_env_ids`.
        max_episode_steps: a different time limit, for environments that have one as a
            parameter (CartPole); None keeps the environment's own.
        render_mode: ``"rgb_array"`` or None.
        entry: the registry entry of an environment the user registered (set by the
            registration itself).
        **env_kwargs: the environment's parameters.

    Raises:
        ValueError: a bad ``num_envs``, id, parameter, time limit or render mode.
    """

    metadata: dict[str, Any] = {
        "render_modes": ["rgb_array"],
        "render_fps": 30,
        "autoreset_mode": AutoresetMode.NEXT_STEP,
    }

    def __init__(
        self,
        num_envs: int,
        env_id: str,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
        entry: Any = None,
        **env_kwargs: Any,
    ) -> None:
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs={num_envs!r} was asked; it must be a positive integer.")
        _check_render_mode(render_mode)
        env = _jax_env(env_id, entry, env_kwargs)
        if max_episode_steps is not None and max_episode_steps != env.max_episode_steps:
            if "max_episode_steps" not in {f.name for f in dataclasses.fields(env) if f.init}:
                raise ValueError(
                    f"max_episode_steps={max_episode_steps} was asked, but every {env_id} "
                    f"episode lasts {env.max_episode_steps} steps by construction; leave it out."
                )
            env = dataclasses.replace(env, max_episode_steps=max_episode_steps)
        self.jax_env = env
        self.num_envs = num_envs
        self.render_mode = render_mode
        self.metadata = {**type(self).metadata, "render_fps": getattr(env, "render_fps", 30)}
        self.single_observation_space = _observation_space(env)
        self.single_action_space = gym.spaces.Discrete(env.num_actions)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._fns = compiled(env)
        self._keys: jax.Array | None = None
        self._state: Any = None
        self._done = np.zeros(num_envs, dtype=bool)

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        _check_options(options)
        if isinstance(seed, int):
            super().reset(seed=seed)
            seeds: list[int | None] = [seed + i for i in range(self.num_envs)]
        elif seed is None:
            seeds = [None] * self.num_envs
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(
                    f"reset got {len(seeds)} seeds for {self.num_envs} envs; pass one per "
                    "env, a single int, or None."
                )
        if self._keys is None or any(s is not None for s in seeds):
            # An env without a seed of its own continues its key sequence, or starts a
            # random one on the first reset.
            fresh = [s if s is not None else int(self.np_random.integers(2**63)) for s in seeds]
            data = _key_data(fresh)
            if self._keys is not None:
                kept = np.array([s is None for s in seeds])
                data[kept] = np.asarray(jax.random.key_data(self._keys))[kept]
            self._keys = _wrap_keys(data)
        self._keys, self._state, obs = self._fns.reset_batch(self._keys)
        self._done = np.zeros(self.num_envs, dtype=bool)
        return np.array(obs), {}

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self._state is None:
            raise gym.error.ResetNeeded("step() was called before reset(); call reset() first.")
        actions = np.asarray(actions)
        if (
            actions.shape != (self.num_envs,)
            or not np.issubdtype(actions.dtype, np.integer)
            or actions.min() < 0
            or actions.max() >= self.jax_env.num_actions
        ):
            raise ValueError(
                f"step got actions of shape {actions.shape} and dtype {actions.dtype}; "
                f"{self.jax_env.id} needs {self.num_envs} integers in "
                f"0..{self.jax_env.num_actions - 1}."
            )
        self._keys, self._state, *out = self._fns.step_batch(
            self._keys, self._state, self._done, actions.astype(np.int32)
        )
        obs, rewards, terminated, truncated = jax.device_get(out)
        self._done = terminated | truncated
        return np.array(obs), np.array(rewards), terminated, truncated, {}

    def render(self) -> tuple[np.ndarray, ...] | None:
        if self.render_mode is None or self._state is None:
            return None
        states = jax.device_get(self._state)
        return tuple(
            self.jax_env.render(jax.tree.map(lambda x, i=i: x[i], states))
            for i in range(self.num_envs)
        )
