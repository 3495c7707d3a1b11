"""Actors mode: one chip's learner, learning from batches that rollout actors made on the
hosts' CPUs (the Sebulba layout).

The learner asks its :class:`TrajectorySource` for the next batch with its current policy
before it learns from the one it has, so rollouts are exactly one policy version behind
the learner on every chip and every run alike: reproducible on any hardware.
"""

from __future__ import annotations

import time
from typing import Protocol

import numpy as np

from workbench.algos.base import Trajectory, join_env_columns
from workbench.learn.learner import AXIS, ChipLearner, LearnerSetup, StepOutcome
from workbench.learn.rollout import RolloutBatch


class TrajectorySource(Protocol):
    """Where one chip's batches come from (rollout actors through Ray, or a worker in
    this process); the learn layer only asks and takes."""

    def request(self, policy, version: int) -> None:
        """Start the next batch, acting with ``policy`` (numpy) at ``version``."""

    def take(self) -> list[RolloutBatch]:
        """The batch(es) requested last; blocks until they are there."""

    def drain(self) -> None:
        """Wait for anything still in flight (the end of the run)."""


class LocalSource:
    """A :class:`TrajectorySource` over rollout workers in this process (tests, notebooks)."""

    def __init__(self, workers: list) -> None:
        self.workers = workers
        self._request = None

    def request(self, policy, version: int) -> None:
        self._request = (policy, version)

    def take(self) -> list[RolloutBatch]:
        policy, version = self._request
        return [w.sample(policy, version) for w in self.workers]

    def drain(self) -> None:
        self._request = None


class BatchLearner(ChipLearner):
    """One chip's learner in actors mode."""

    host_rollouts = True
    env_kind = "gymnasium"

    def __init__(self, setup: LearnerSetup, source: TrajectorySource) -> None:
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        super().__init__(setup)
        self.source = source
        self._pending = False
        self._pending_policy = None
        self._resumed_policy = None
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
        policy = jax.eval_shape(self.agent.policy, jax.eval_shape(self.agent.init,
                                                                  jax.random.PRNGKey(0)))
        actions, extras = jax.eval_shape(self.agent.act, policy, obs, jax.random.PRNGKey(0))

        def over_time(x):
            return jax.ShapeDtypeStruct((T, *x.shape), x.dtype)

        flags = jax.ShapeDtypeStruct((T, N), jnp.bool_)
        return Trajectory(
            obs=over_time(obs), actions=over_time(actions),
            rewards=jax.ShapeDtypeStruct((T, N), jnp.float32), terminated=flags,
            truncated=flags, valid=flags, extras=jax.tree.map(over_time, extras), last_obs=obs,
        )

    def _lower(self):
        import jax

        shapes = self._trajectory_shapes(self.num_chips)
        shardings = jax.tree.map(lambda _: self._per_env, shapes._replace(last_obs=None))
        shardings = shardings._replace(last_obs=self._per_chip)
        abstract = jax.tree.map(
            lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
            shapes, shardings,
        )
        return self._update.lower(self.state, abstract, self._update_key(),
                                  self._requests(False, False))

    def _request(self, policy, version: int) -> None:
        self._pending_policy = policy
        self.source.request(policy, version)

    def step(self, stop: bool = False, checkpoint: bool = False) -> StepOutcome:
        import jax

        if not self._pending:
            # A resumed run asks first for what the checkpointed run had in flight.
            policy = self._resumed_policy if self._resumed_policy is not None else \
                self.policy_numpy()
            self._resumed_policy = None
            self._request(policy, self._updates)
        batches = self.source.take()
        # NOTE: the next rollout starts now, with the parameters the batches above were
        # not made with, and runs while this update computes: exactly one version behind.
        self._request(self.policy_numpy(), self._updates + 1)
        self._pending = True
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
            self._pending = False

    def resume_state(self) -> dict:
        # The rollout in flight was asked for with the policy before this update: a resumed
        # run asks for the same (and its rollout actors restart from their envs then).
        import jax

        return {"pending_policy": jax.tree.leaves(self._pending_policy)}

    def load_resume_state(self, resume: dict[str, list]) -> bool:
        import jax

        leaves = resume.get("pending_policy")
        if not leaves:
            return False
        treedef = jax.tree.structure(self.policy_numpy())
        if treedef.num_leaves != len(leaves):
            return False
        self._resumed_policy = jax.tree.unflatten(treedef, list(leaves))
        return True
