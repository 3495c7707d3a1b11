"""Actors mode: one chip's learner, learning from batches that rollout actors made on the
hosts' CPUs (the Sebulba layout).

The learner keeps ``policy_lag`` requests in flight with its :class:`TrajectorySource`:
before it learns from the oldest batch, it asks for the one ``policy_lag`` updates ahead
with its current policy. So each batch was made by the policy exactly ``policy_lag``
versions behind the one learning from it, on every chip and every run alike: reproducible
on any hardware. With a lag of 1 a rollout overlaps one update; more lets the actors run
further ahead, and algorithms that correct for it (IMPALA's V-trace) learn from it.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Protocol

import numpy as np

from workbench.algos.base import Trajectory, join_env_columns
from workbench.learn.learner import AXIS, ChipLearner, LearnerSetup, StepOutcome
from workbench.learn.rollout import RolloutBatch


class TrajectorySource(Protocol):
    """Where one chip's batches come from (rollout actors through Ray, or a worker in
    this process); the learn layer only asks and takes."""

    def request(self, policy, policy_version: int, for_update: int) -> None:
        """Ask for the batch ``for_update`` learns from, acting with ``policy`` (numpy),
        the learner's policy after ``policy_version`` updates."""

    def take(self) -> list[RolloutBatch]:
        """The oldest batch(es) asked for; blocks until they are there."""

    def drain(self) -> None:
        """Wait for anything still in flight (the end of the run)."""


class LocalSource:
    """A :class:`TrajectorySource` over rollout workers in this process (tests, notebooks)."""

    def __init__(self, workers: list) -> None:
        self.workers = workers
        self._asked: deque = deque()

    def request(self, policy, policy_version: int, for_update: int) -> None:
        self._asked.append((policy, policy_version, for_update))

    def take(self) -> list[RolloutBatch]:
        asked = self._asked.popleft()
        return [w.sample(*asked) for w in self.workers]

    def drain(self) -> None:
        self._asked.clear()


class BatchLearner(ChipLearner):
    """One chip's learner in actors mode."""

    host_rollouts = True
    env_kind = "gymnasium"

    def __init__(self, setup: LearnerSetup, source: TrajectorySource | None, *,
                 devices=None, abstract: bool = False) -> None:
        """Build the update over the mesh (see :class:`ChipLearner` for ``devices`` and
        ``abstract``); ``source`` gives the batches (None for a learner that only
        compiles)."""
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        super().__init__(setup, devices=devices, abstract=abstract)
        self.source = source
        self.lag = setup.policy_lag
        self._pending: deque = deque()
        """(for_update, policy) of every request in flight, oldest first."""
        self._resumed: dict[int, object] = {}
        self._per_env = NamedSharding(self.mesh, P(None, AXIS))
        specs = self._trajectory_specs()
        self._update = jax.jit(
            jax.shard_map(
                self.chip_update,
                mesh=self.mesh,
                in_specs=(P(), specs, P(), P(AXIS)),
                out_specs=(P(), P(), P()),
                check_vma=self.check_replication,
            ),
            donate_argnums=(0,),
        )

    def _trajectory_specs(self) -> Trajectory:
        import jax
        from jax.sharding import PartitionSpec as P

        template = self._trajectory_shapes(1)
        specs = jax.tree.map(lambda _: P(None, AXIS), template._replace(last_obs=None))
        return specs._replace(last_obs=P(AXIS))

    def _trajectory_shapes(self, num_chips: int) -> Trajectory:
        """Shapes and dtypes of the global trajectory one update learns from."""
        import jax
        import jax.numpy as jnp

        spaces = self.setup.agent.spaces
        T, N = self.setup.rollout_length, self.setup.envs_per_chip * num_chips
        obs = jax.ShapeDtypeStruct((N, *spaces.obs_shape), jnp.float32)
        key = jax.eval_shape(jax.random.PRNGKey, 0)  # a shape: nothing runs
        policy = jax.eval_shape(self.agent.policy, jax.eval_shape(self.agent.init, key))
        actions, extras = jax.eval_shape(self.agent.act, policy, obs, key)

        def over_time(x):
            return jax.ShapeDtypeStruct((T, *x.shape), x.dtype)

        flags = jax.ShapeDtypeStruct((T, N), jnp.bool_)
        return Trajectory(
            obs=over_time(obs), actions=over_time(actions),
            rewards=jax.ShapeDtypeStruct((T, N), jnp.float32), terminated=flags,
            truncated=flags, valid=flags, extras=jax.tree.map(over_time, extras), last_obs=obs,
        )

    def _trace_update(self):
        import jax

        shapes = self._trajectory_shapes(self.num_chips)
        shardings = jax.tree.map(lambda _: self._per_env, shapes._replace(last_obs=None))
        shardings = shardings._replace(last_obs=self._per_chip)
        abstract = jax.tree.map(
            lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
            shapes, shardings,
        )
        return self._update.trace(self.state, abstract, self._update_key(),
                                  self._requests(False, False))

    def _request(self, policy, for_update: int) -> None:
        self._pending.append((for_update, policy))
        self.source.request(policy, self._updates, for_update)

    def step(self, stop: bool = False, checkpoint: bool = False) -> StepOutcome:
        import jax

        if not self._pending:
            # A resumed run asks first for what the checkpointed run had in flight.
            for for_update in range(self._updates, self._updates + self.lag):
                resumed = self._resumed.pop(for_update, None)
                self._request(resumed if resumed is not None else self.policy_numpy(),
                              for_update)
        batches = self.source.take()
        self._pending.popleft()
        # NOTE: the next rollout is asked for now, and runs while this update computes:
        # the batch this one learns from was made policy_lag versions ago.
        self._request(self.policy_numpy(), self._updates + self.lag)
        started = time.perf_counter()
        local = join_env_columns([b.trajectory for b in batches], concatenate=np.concatenate)
        steps = jax.tree.map(
            lambda x: jax.make_array_from_process_local_data(self._per_env, x),
            local._replace(last_obs=None),
        )
        trajectory = steps._replace(
            last_obs=jax.make_array_from_process_local_data(self._per_chip, local.last_obs)
        )
        self.compile()
        self.state, metrics, agreed = self._compiled(
            self.state, trajectory, self._update_key(), self._requests(stop, checkpoint)
        )
        self._updates += 1
        agreed_stop, agreed_checkpoint = self._agreed(agreed)
        return StepOutcome(
            metrics=self._metrics(metrics),
            stop=agreed_stop,
            checkpoint=agreed_checkpoint,
            step_s=time.perf_counter() - started,
            env_steps=sum(b.env_steps for b in batches) * self.num_chips,
            episode_returns=tuple(r for b in batches for r in b.episode_returns),
            policy_versions=tuple(b.policy_version for b in batches),
        )

    def finish(self) -> None:
        if self._pending:
            self.source.drain()
            self._pending.clear()

    def resume_state(self) -> dict:
        # The rollouts in flight were asked for with older policies: a resumed run asks
        # for the same (and its rollout actors restart from their envs then).
        import jax

        return {f"pending_{i}": jax.tree.leaves(policy)
                for i, (_, policy) in enumerate(self._pending)}

    def load_resume_state(self, resume: dict[str, list]) -> bool:
        import jax

        treedef = jax.tree.structure(self.policy_numpy())
        pending = [resume.get(f"pending_{i}") for i in range(self.lag)]
        if not all(leaves and len(leaves) == treedef.num_leaves for leaves in pending):
            return False
        self._resumed = {self._updates + i: jax.tree.unflatten(treedef, list(leaves))
                         for i, leaves in enumerate(pending)}
        return True
