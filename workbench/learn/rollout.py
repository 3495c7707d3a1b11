"""Stepping gymnasium vector environments with the current policy, on host CPUs.

``RolloutWorker`` is a plain class: the engine layer runs it inside a Ray actor beside the
chips' learners, and tests run it in-process. Acting is the algorithm's own ``act``,
jitted on the CPU; the worker never touches a TPU and knows no algorithm by name.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import gymnasium as gym
import numpy as np

from workbench.algos.base import CONTINUOUS, DISCRETE, Spaces, Trajectory
from workbench.learn import keys as run_keys
from workbench.learn.compile_cache import kept_in_memory
from workbench.learn.heap import release_freed_memory

log = logging.getLogger(__name__)


EnvRef = str | gym.envs.registration.EnvSpec
"""A gymnasium id, or the spec itself: what reaches a rollout actor, so that an env the
user registered (in a notebook, or with keyword arguments) needs no registration there."""


ACTING_KEPT = 4
"""Acting programs a rollout process keeps: an actor kept between runs (or warmed for a
run at reservation) skips tracing and compiling its policy again for the same agent."""
_acting_programs: OrderedDict = OrderedDict()


def _acting_program(spec, agent, obs: np.ndarray):
    """``(policy shapes, packer, act)`` for acting with ``agent`` (built from ``spec``) on
    a batch shaped as ``obs``; ``act(policy, obs, key) -> (key, packed)`` is jitted. Kept
    per process by the spec and the batch's shape: a spec that cannot be pickled here (an
    algorithm defined in a notebook) gets a fresh one."""
    import jax

    def make():
        state = jax.eval_shape(agent.init, jax.random.PRNGKey(0))
        shapes = jax.eval_shape(agent.policy, state)
        packer = _Packer(jax.eval_shape(agent.act, shapes, obs, jax.random.PRNGKey(0)))
        act = agent.act

        def act_packed(policy, batch, key):
            key, sample_key = jax.random.split(key)
            return key, packer.pack(act(policy, batch, sample_key))

        return shapes, packer, jax.jit(act_packed)

    try:
        key = hashlib.sha256(pickle.dumps((spec, obs.shape, obs.dtype.str))).digest()
    except (pickle.PicklingError, AttributeError, TypeError):
        return make()
    return kept_in_memory(_acting_programs, key, make, ACTING_KEPT)


def wrapper_of(wrapper) -> type:
    """A gymnasium wrapper given as a class, ``"module:Class"`` or a name in
    ``gymnasium.wrappers`` (e.g. ``"ClipReward"``... those without required arguments)."""
    import importlib

    if not isinstance(wrapper, str):
        return wrapper
    module, _, name = wrapper.rpartition(":")
    found = getattr(importlib.import_module(module or "gymnasium.wrappers"), name, None)
    if found is None:
        raise ValueError(f"No gymnasium wrapper {wrapper!r}: give a class, 'module:Class', or "
                         "the name of one in gymnasium.wrappers.")
    return found


def make_vector_env(env: EnvRef, num_envs: int, seed: int,
                    wrappers: tuple = ()) -> gym.vector.VectorEnv:
    """A vector env of ``env``: the env's own vectorised form when it has one (numpy
    CartPole steps thousands of envs at once) and no wrappers are asked for, otherwise a
    synchronous loop over single envs, each wrapped in ``wrappers`` (innermost first)."""
    wrap = [wrapper_of(w) for w in wrappers]
    vector = None
    if not wrap:
        try:
            vector = gym.make_vec(env, num_envs=num_envs,
                                  vectorization_mode="vector_entry_point")
        except (gym.error.Error, ValueError, TypeError, AttributeError):
            vector = None
    if vector is None:
        vector = gym.make_vec(env, num_envs=num_envs, vectorization_mode="sync",
                              wrappers=wrap or None)
    vector.reset(seed=seed)
    return vector


def spaces_of(observation_space: gym.Space, action_space: gym.Space, env_id: str) -> Spaces:
    """The algorithm-facing description of a gymnasium env's spaces.

    Raises:
        ValueError: an observation space that is not a ``Box``, or an action space that
            is neither ``Discrete`` nor ``Box``.
    """
    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(
            f"{env_id} has a {type(observation_space).__name__} observation space; the "
            "workbench trains on Box observations (wrap the env to flatten it)."
        )
    obs_shape = tuple(int(d) for d in observation_space.shape)
    if isinstance(action_space, gym.spaces.Discrete):
        return Spaces(obs_shape, DISCRETE, num_actions=int(action_space.n))
    if isinstance(action_space, gym.spaces.Box):
        return Spaces(
            obs_shape, CONTINUOUS, action_shape=tuple(int(d) for d in action_space.shape),
            action_low=tuple(float(x) for x in np.ravel(action_space.low)),
            action_high=tuple(float(x) for x in np.ravel(action_space.high)),
        )
    raise ValueError(
        f"{env_id} has a {type(action_space).__name__} action space; the workbench trains "
        "on Discrete and Box action spaces."
    )


def env_spaces(env: EnvRef, wrappers: tuple = ()) -> Spaces:
    """The spaces of the gymnasium env ``env`` with ``wrappers`` (made once, then closed)."""
    made = gym.make(env)
    for wrapper in wrappers:
        made = wrapper_of(wrapper)(made)
    name = env if isinstance(env, str) else env.id
    try:
        return spaces_of(made.observation_space, made.action_space, name)
    finally:
        made.close()


@dataclass
class RolloutBatch:
    """One rollout, time-major ``[T, N]``, with the policy version that produced it."""

    policy_version: int
    """How many updates the policy that made it had seen."""
    trajectory: Trajectory
    """numpy arrays."""
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    episode_envs: list[int] = field(default_factory=list)
    """Which env (column) each finished episode ran in."""

    @property
    def env_steps(self) -> int:
        return int(self.trajectory.rewards.size)

    def split(self, parts: int) -> list[RolloutBatch]:
        """Cut the batch by env columns into ``parts`` equal batches, one per learner."""
        import jax

        width = self.trajectory.rewards.shape[1] // parts
        pieces = []
        for p in range(parts):
            cols = slice(p * width, (p + 1) * width)
            steps = jax.tree.map(lambda x, c=cols: x[:, c],
                                 self.trajectory._replace(last_obs=None))
            mine = [i for i, env in enumerate(self.episode_envs) if cols.start <= env < cols.stop]
            pieces.append(
                replace(
                    self,
                    trajectory=steps._replace(last_obs=self.trajectory.last_obs[cols]),
                    episode_returns=[self.episode_returns[i] for i in mine],
                    episode_lengths=[self.episode_lengths[i] for i in mine],
                    episode_envs=[self.episode_envs[i] - cols.start for i in mine],
                )
            )
        return pieces


class _Packer:
    """Moves what ``act`` returns for a step (actions and extras, any shapes) to the host in
    one transfer: one float32 ``[N, K]`` array, cut apart again by columns."""

    def __init__(self, example) -> None:
        import jax

        leaves, self.treedef = jax.tree.flatten(example)
        self.shapes = [leaf.shape[1:] for leaf in leaves]
        self.dtypes = [leaf.dtype for leaf in leaves]
        widths = [int(np.prod(s, dtype=int)) for s in self.shapes]
        self.bounds = np.cumsum([0, *widths])

    def pack(self, tree):
        import jax
        import jax.numpy as jnp

        leaves = jax.tree.leaves(tree)
        return jnp.concatenate(
            [leaf.reshape(leaf.shape[0], -1).astype(jnp.float32) for leaf in leaves], axis=1
        )

    def unpack(self, packed: np.ndarray):
        """The tree back from packed rows ``[..., K]`` (any leading axes)."""
        import jax

        lead = packed.shape[:-1]
        leaves = [
            packed[..., a:b].reshape(lead + shape).astype(dtype)
            for a, b, shape, dtype in zip(self.bounds[:-1], self.bounds[1:], self.shapes,
                                          self.dtypes, strict=True)
        ]
        return jax.tree.unflatten(self.treedef, leaves)

    def first(self, packed: np.ndarray) -> np.ndarray:
        """Only the first leaf (the actions, for ``act``'s ``(actions, extras)``)."""
        lead = packed.shape[:-1]
        return packed[..., : self.bounds[1]].reshape(lead + self.shapes[0]).astype(self.dtypes[0])


class RolloutWorker:
    """Steps ``num_envs`` copies of a gymnasium environment for ``rollout_length`` steps
    per call, acting with an algorithm's ``act``.

    Args:
        env_id: a registered gymnasium id.
        num_envs: envs stepped together.
        rollout_length: steps per env in one rollout.
        agent: the :class:`~workbench.learn.learner.AgentSpec` whose ``act`` is used.
        seed: the run's seed.
        index: which env batch of the run this is: its envs and its sampling take their
            keys from the run's key tree under this index.
        keep_snapshots: how many of the latest rollouts' start states to keep for a
            checkpoint (the rollouts a learner can have in flight, plus one).
        wrappers: gymnasium wrappers for every env (see :func:`make_vector_env`).
    """

    def __init__(self, env_id: EnvRef, num_envs: int, rollout_length: int, agent, seed: int,
                 index: int = 0, keep_snapshots: int = 2, wrappers: tuple = ()) -> None:
        import jax

        self.env_id = env_id
        self.num_envs = num_envs
        self.rollout_length = rollout_length
        key = run_keys.env_key(run_keys.run_keys(seed), index)
        env_seed_key, self._key = jax.random.split(key)
        env_seed = run_keys.as_seed(env_seed_key)
        self.env = make_vector_env(env_id, num_envs, env_seed, wrappers)
        self.agent = agent.build()
        self._obs, _ = self.env.reset(seed=env_seed)
        self._obs = np.asarray(self._obs, np.float32)
        self._policy_shapes, self._packer, self._act = _acting_program(agent, self.agent,
                                                                       self._obs)
        self._done = np.zeros(num_envs, dtype=bool)
        self._episode_return = np.zeros(num_envs)
        self._episode_length = np.zeros(num_envs, dtype=np.int64)
        self._compiled = False
        self._snapshots: dict[int, bytes | None] = {}
        self._keep_snapshots = keep_snapshots
        self._unpicklable_warned = False

    def prepare(self) -> None:
        """Compile acting now (on a policy of zeros), not in the first rollout."""
        import jax

        zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), self._policy_shapes)
        self._act(zeros, self._obs, self._key)
        self._compiled = True
        release_freed_memory()

    # ---- exact resumes -------------------------------------------------------------------

    def _snapshot(self) -> bytes | None:
        # NOTE: gymnasium's SyncVectorEnv keeps the generator of its env makers, which
        # cannot be pickled and is not needed after construction.
        makers = getattr(self.env, "env_fns", None)
        if makers is not None and not isinstance(makers, (list, tuple)):
            self.env.env_fns = None
        try:
            return pickle.dumps((self.env, self._obs, self._done, self._episode_return,
                                 self._episode_length, np.asarray(self._key)))
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            if not self._unpicklable_warned:
                self._unpicklable_warned = True
                log.warning("%s's envs cannot be pickled (%s): a resumed run starts them "
                            "afresh", getattr(self.env_id, "id", self.env_id), error)
            return None
        finally:
            if makers is not None and not isinstance(makers, (list, tuple)):
                self.env.env_fns = makers

    def snapshot(self, for_update: int) -> bytes | None:
        """The envs as they were before the rollout for update ``for_update`` (the latest
        few are kept): what a checkpoint needs to resume this worker exactly."""
        return self._snapshots.get(for_update)

    def restore(self, snapshot: bytes) -> bool:
        """Continue from a :meth:`snapshot` (read from this user's own checkpoint). False,
        changing nothing, when it holds another number of envs (a checkpoint of another
        slice shape): the envs then start afresh."""
        env, obs, done, episode_return, episode_length, key = pickle.loads(snapshot)
        if obs.shape[0] != self.num_envs:
            env.close()
            return False
        self.env.close()
        self.env, self._obs, self._done = env, obs, done
        self._episode_return, self._episode_length, self._key = episode_return, \
            episode_length, key
        return True

    def sample(self, policy, policy_version: int, for_update: int | None = None) -> RolloutBatch:
        """Collect one rollout acting with ``policy`` (a pytree of numpy arrays) after
        ``policy_version`` updates, for update ``for_update`` (default: that version)."""
        import jax

        for_update = policy_version if for_update is None else for_update
        self._snapshots[for_update] = self._snapshot()
        for old in sorted(self._snapshots)[:-self._keep_snapshots]:
            del self._snapshots[old]

        T, N = self.rollout_length, self.num_envs
        obs_buf = np.zeros((T, N) + self._obs.shape[1:], dtype=np.float32)
        acted = np.zeros((T, N, int(self._packer.bounds[-1])), dtype=np.float32)
        rewards = np.zeros((T, N), dtype=np.float32)
        terminated = np.zeros((T, N), dtype=bool)
        truncated = np.zeros((T, N), dtype=bool)
        valid = np.zeros((T, N), dtype=bool)
        episode_returns: list[float] = []
        episode_lengths: list[int] = []
        episode_envs: list[int] = []
        policy = jax.device_put(policy)
        for t in range(T):
            self._key, packed = self._act(policy, self._obs, self._key)
            acted[t] = packed
            actions = self._packer.first(acted[t])
            obs_buf[t] = self._obs
            # NOTE: with next-step autoreset, an env that finished last step ignores this
            # action and resets; the step is kept for its value (the bootstrap of a
            # truncated episode) but masked out of the loss.
            valid[t] = ~self._done
            obs, reward, term, trunc, _ = self.env.step(actions)
            self._obs = np.asarray(obs, np.float32)
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
        if not self._compiled:
            # The policy compiled on first use; what the compiler freed goes back to the OS.
            self._compiled = True
            release_freed_memory()
        actions, extras = self._packer.unpack(acted)
        trajectory = Trajectory(
            obs=obs_buf, actions=actions, rewards=rewards, terminated=terminated,
            truncated=truncated, valid=valid, extras=extras, last_obs=self._obs.copy(),
        )
        return RolloutBatch(policy_version, trajectory, episode_returns, episode_lengths,
                            episode_envs)

    def close(self) -> None:
        self.env.close()
