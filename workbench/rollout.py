"""Stepping gymnasium vector environments with the current policy, on host CPUs.

``RolloutWorker`` is a plain class: the engine runs it as a Ray actor beside its chip's
learner, and tests run it in-process. Policy inference is a small jitted JAX function on
the CPU; the worker never touches a TPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np


def make_vector_env(env_id: str, num_envs: int, seed: int) -> gym.vector.VectorEnv:
    """A vector env of ``env_id``: the env's own vectorised form when it has one (numpy
    CartPole steps thousands of envs at once), otherwise a synchronous loop."""
    try:
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
    except (gym.error.Error, ValueError, TypeError, AttributeError):
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
    env.reset(seed=seed)
    return env


def env_spaces(env_id: str) -> tuple[np.ndarray, int]:
    """An example observation and the number of discrete actions of ``env_id``."""
    env = gym.make(env_id)
    try:
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise ValueError(
                f"{env_id} has a {type(env.action_space).__name__} action space; the PPO "
                "here handles Discrete action spaces."
            )
        obs, _ = env.reset(seed=0)
        return np.asarray(obs, dtype=np.float32), int(env.action_space.n)
    finally:
        env.close()


@dataclass
class RolloutBatch:
    """One rollout, time-major ``[T, N]``, with the policy version that produced it."""

    policy_version: int
    obs: np.ndarray
    actions: np.ndarray
    log_probs: np.ndarray
    values: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray
    last_value: np.ndarray
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)

    @property
    def env_steps(self) -> int:
        return int(self.rewards.size)


class RolloutWorker:
    """Steps ``num_envs`` copies of an environment for ``rollout_length`` steps per call."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        rollout_length: int,
        seed: int,
        hidden_sizes: tuple[int, ...] = (64, 64),
    ) -> None:
        import jax
        import jax.numpy as jnp

        from workbench.algos.ppo import ActorCritic, greedy_step, policy_step

        self.env_id = env_id
        self.env = make_vector_env(env_id, num_envs, seed)
        self.num_envs = num_envs
        self.rollout_length = rollout_length
        obs_example, num_actions = env_spaces(env_id)
        self.network = ActorCritic(num_actions, tuple(hidden_sizes))
        act = policy_step(self.network)

        def act_packed(params, obs, key):
            # One host transfer per step instead of three.
            key, actions, log_probs, values = act(params, obs, key)
            return key, jnp.stack([actions.astype(jnp.float32), log_probs, values])

        self._act = jax.jit(act_packed)
        self._greedy = jax.jit(greedy_step(self.network))
        self._value = jax.jit(lambda p, o: self.network.apply(p, o)[1])
        self._key = jax.random.PRNGKey(seed)
        self._obs, _ = self.env.reset(seed=seed)
        self._done = np.zeros(num_envs, dtype=bool)
        self._episode_return = np.zeros(num_envs)
        self._episode_length = np.zeros(num_envs, dtype=np.int64)
        self._seed = seed

    def sample(self, params, policy_version: int) -> RolloutBatch:
        """Collect one rollout with ``params`` (a pytree of numpy arrays)."""
        import jax

        T, N = self.rollout_length, self.num_envs
        obs_buf = np.zeros((T, N) + self._obs.shape[1:], dtype=np.float32)
        actions = np.zeros((T, N), dtype=np.int32)
        log_probs = np.zeros((T, N), dtype=np.float32)
        values = np.zeros((T, N), dtype=np.float32)
        rewards = np.zeros((T, N), dtype=np.float32)
        terminated = np.zeros((T, N), dtype=bool)
        truncated = np.zeros((T, N), dtype=bool)
        valid = np.zeros((T, N), dtype=bool)
        episode_returns: list[float] = []
        episode_lengths: list[int] = []
        params = jax.device_put(params)
        for t in range(T):
            self._key, packed = self._act(params, self._obs, self._key)
            packed = np.asarray(packed)
            action = packed[0].astype(np.int32)
            obs_buf[t] = self._obs
            actions[t], log_probs[t], values[t] = action, packed[1], packed[2]
            # NOTE: with next-step autoreset, an env that finished last step ignores this
            # action and resets; the step is kept for its value (the bootstrap of a
            # truncated episode) but masked out of the loss.
            valid[t] = ~self._done
            self._obs, reward, term, trunc, _ = self.env.step(action)
            rewards[t] = reward
            terminated[t] = term & valid[t]
            truncated[t] = trunc & valid[t]
            self._episode_return += np.where(valid[t], reward, 0.0)
            self._episode_length += valid[t]
            self._done = (term | trunc) & valid[t]
            for i in np.flatnonzero(self._done):
                episode_returns.append(float(self._episode_return[i]))
                episode_lengths.append(int(self._episode_length[i]))
                self._episode_return[i] = 0.0
                self._episode_length[i] = 0
        last_value = np.asarray(self._value(params, self._obs), dtype=np.float32)
        return RolloutBatch(
            policy_version=policy_version,
            obs=obs_buf,
            actions=actions,
            log_probs=log_probs,
            values=values,
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            valid=valid,
            last_value=last_value,
            episode_returns=episode_returns,
            episode_lengths=episode_lengths,
        )

    def evaluate(self, params, episodes: int = 20, seed: int = 10_000) -> list[float]:
        """Returns of ``episodes`` episodes with the greedy policy, on fresh envs."""
        env = make_vector_env(self.env_id, episodes, seed)
        obs, _ = env.reset(seed=seed)
        totals = np.zeros(episodes)
        running = np.ones(episodes, dtype=bool)
        try:
            while running.any():
                action = np.asarray(self._greedy(params, obs))
                obs, reward, term, trunc, _ = env.step(action)
                totals += np.where(running, reward, 0.0)
                running &= ~(term | trunc)
        finally:
            env.close()
        return totals.tolist()

    def close(self) -> None:
        self.env.close()
