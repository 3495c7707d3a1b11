"""Stepping gymnasium vector environments with the current policy, on host CPUs.

``RolloutWorker`` is a plain class: the engine runs it as a Ray actor beside its chip's
learner, and tests run it in-process. Policy inference is a small jitted JAX function on
the CPU; the worker never touches a TPU.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

import gymnasium as gym
import numpy as np

from workbench.heap import release_freed_memory


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
    episode_envs: list[int] = field(default_factory=list)
    """Which env (column) each finished episode ran in."""

    @property
    def env_steps(self) -> int:
        return int(self.rewards.size)

    def split(self, parts: int) -> list[RolloutBatch]:
        """Cut the batch by env columns into ``parts`` equal batches, one per learner."""
        width = self.rewards.shape[1] // parts
        pieces = []
        for p in range(parts):
            cols = slice(p * width, (p + 1) * width)
            mine = [i for i, env in enumerate(self.episode_envs) if cols.start <= env < cols.stop]
            pieces.append(
                replace(
                    self,
                    obs=self.obs[:, cols],
                    actions=self.actions[:, cols],
                    log_probs=self.log_probs[:, cols],
                    values=self.values[:, cols],
                    rewards=self.rewards[:, cols],
                    terminated=self.terminated[:, cols],
                    truncated=self.truncated[:, cols],
                    valid=self.valid[:, cols],
                    last_value=self.last_value[cols],
                    episode_returns=[self.episode_returns[i] for i in mine],
                    episode_lengths=[self.episode_lengths[i] for i in mine],
                    episode_envs=[self.episode_envs[i] - cols.start for i in mine],
                )
            )
        return pieces


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
        from workbench.envs import jax_env_ids, make_jax

        self.env_id = env_id
        self.env = make_vector_env(env_id, num_envs, seed)
        self.num_envs = num_envs
        self.rollout_length = rollout_length
        obs_example, num_actions = env_spaces(env_id)
        self._obs_example = obs_example
        self.network = ActorCritic(num_actions, tuple(hidden_sizes))
        act = policy_step(self.network)

        def act_packed(params, obs, key):
            # One host transfer per step instead of three.
            key, actions, log_probs, values = act(params, obs, key)
            return key, jnp.stack([actions.astype(jnp.float32), log_probs, values])

        self._act = jax.jit(act_packed)
        self._greedy = jax.jit(greedy_step(self.network))
        self._greedy_episodes = None
        if env_id in jax_env_ids():
            from workbench.anakin import make_greedy_evaluation

            # A JAX env's evaluation is one compiled program, not a Python loop of steps.
            self._greedy_episodes = jax.jit(
                make_greedy_evaluation(make_jax(env_id), self.network),
                static_argnames="episodes",
            )
        self._value = jax.jit(lambda p, o: self.network.apply(p, o)[1])
        self._key = jax.random.PRNGKey(seed)
        self._obs, _ = self.env.reset(seed=seed)
        self._done = np.zeros(num_envs, dtype=bool)
        self._episode_return = np.zeros(num_envs)
        self._episode_length = np.zeros(num_envs, dtype=np.int64)
        self._compiled = False

    def _after_first_use(self) -> None:
        # The policy compiles on first use; what the compiler freed goes back to the OS.
        if not self._compiled:
            self._compiled = True
            release_freed_memory()

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
        episode_envs: list[int] = []
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
                episode_envs.append(int(i))
                self._episode_return[i] = 0.0
                self._episode_length[i] = 0
        last_value = np.asarray(self._value(params, self._obs), dtype=np.float32)
        self._after_first_use()
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
            episode_envs=episode_envs,
        )

    def evaluate(self, params, episodes: int = 20, seed: int = 10_000) -> list[float]:
        """Returns of ``episodes`` episodes with the greedy policy, on fresh envs."""
        if self._greedy_episodes is not None:
            import jax

            key = jax.random.PRNGKey(seed)
            totals = np.asarray(self._greedy_episodes(params, key, episodes=episodes), float)
        else:
            totals = self._evaluate_stepped(params, episodes, seed)
        # Rare, and the first one compiles the greedy policy: a good moment to give back.
        release_freed_memory()
        return totals.tolist()

    def prepare_evaluation(self, episodes: int) -> None:
        """Compile the greedy evaluation now (with the network's initial parameters), so
        that the first one of a training loop does not compile beside the learners."""
        import jax

        # Zeros of the parameters' shapes compile the same program; initialising the
        # network for real would compile each of its initialisers on its own, for seconds.
        shapes = jax.eval_shape(self.network.init, jax.random.PRNGKey(0), self._obs_example[None])
        self.evaluate(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes), episodes)

    def _evaluate_stepped(self, params, episodes: int, seed: int) -> np.ndarray:
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
        return totals

    def close(self) -> None:
        self.env.close()


class SharedRollout:
    """A rollout actor feeding several learners of one host from one set of envs.

    Each learner asks for its part of the next rollout; when all have asked, one policy
    forward per step serves every learner's envs, and each learner gets its columns.
    Run as a Ray actor with ``max_concurrency`` equal to ``parts``.
    """

    def __init__(
        self,
        env_id: str,
        envs_per_part: int,
        parts: int,
        rollout_length: int,
        seed: int,
        hidden_sizes: tuple[int, ...] = (64, 64),
        wait_s: float = 600.0,
    ) -> None:
        self.worker = RolloutWorker(env_id, envs_per_part * parts, rollout_length, seed,
                                    hidden_sizes)
        self.parts = parts
        # NOTE: the barrier's action runs once per round, in the last thread to arrive, so
        # the rollout starts only when every learner has asked; a result is read before
        # its learner can ask again, so the next round cannot overwrite it early.
        self._barrier = threading.Barrier(parts, action=self._run, timeout=wait_s)
        self._request: tuple = ()
        self._pieces: list[RolloutBatch] = []

    def _run(self) -> None:
        params, version = self._request
        self._pieces = self.worker.sample(params, version).split(self.parts)

    def sample(self, params, policy_version: int, part: int) -> RolloutBatch:
        """Part ``part`` of the rollout made with ``params`` (every caller passes the same)."""
        self._request = (params, policy_version)
        self._barrier.wait()
        return self._pieces[part]

    def evaluate(self, params, episodes: int = 20) -> list[float]:
        return self.worker.evaluate(params, episodes)


class RolloutKeeper:
    """Owns a run's rollout actors (as a Ray actor that imports no JAX) and replaces one that dies.

    Learners find their rollout actor here; when one dies, each learner it fed asks for
    a replacement and all of them get the same new actor.
    """

    def __init__(self, specs: list[tuple[dict, tuple]]) -> None:
        import ray

        self._cls = ray.remote(SharedRollout)
        self._specs = specs
        self._lock = threading.Lock()
        self.replaced = 0
        self.actors = [self._start(i) for i in range(len(specs))]

    def _start(self, index: int):
        options, args = self._specs[index]
        if self.replaced:
            options = {**options, "name": f"{options['name']}.{self.replaced}"}
        return self._cls.options(**options).remote(*args)

    def actor(self, index: int):
        return self.actors[index]

    def stop_all(self) -> list[str]:
        """Kill every rollout actor now; returns their ids so the caller can wait for the
        cluster to see them gone (Ray tears owned actors down asynchronously)."""
        import ray

        with self._lock:
            for actor in self.actors:
                ray.kill(actor)
            return [actor._actor_id.hex() for actor in self.actors]

    def replace(self, index: int, dead_actor_id: str):
        with self._lock:
            if self.actors[index]._actor_id.hex() == dead_actor_id:
                self.replaced += 1
                self.actors[index] = self._start(index)
            return self.actors[index]
