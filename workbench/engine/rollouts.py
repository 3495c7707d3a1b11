"""Rollout actors on the hosts' CPUs, and the keeper that replaces one that dies.

A rollout actor steps one set of gymnasium vector envs for several learners of its host
with one policy forward per step (a :class:`~workbench.learn.rollout.RolloutWorker`); each
learner reaches it through a :class:`RolloutFeed`, its side of the actors-mode
:class:`~workbench.learn.actors_mode.TrajectorySource`.
"""

from __future__ import annotations

import logging
import threading

from workbench.learn.rollout import RolloutBatch, RolloutWorker

log = logging.getLogger(__name__)


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
        agent,
        seed: int,
        index: int,
        wait_s: float = 600.0,
    ) -> None:
        self.worker = RolloutWorker(env_id, envs_per_part * parts, rollout_length, agent,
                                    seed, index)
        # Compiled now, while the learners start, not in the first rollout.
        self.worker.prepare()
        self.parts = parts
        # NOTE: the barrier's action runs once per round, in the last thread to arrive, so
        # the rollout starts only when every learner has asked; a result is read before
        # its learner can ask again, so the next round cannot overwrite it early.
        self._barrier = threading.Barrier(parts, action=self._run, timeout=wait_s)
        self._request: tuple = ()
        self._pieces: list[RolloutBatch] = []

    def _run(self) -> None:
        policy, version = self._request
        self._pieces = self.worker.sample(policy, version).split(self.parts)

    def sample(self, policy, policy_version: int, part: int) -> RolloutBatch:
        """Part ``part`` of the rollout made with ``policy`` (every caller passes the same)."""
        self._request = (policy, policy_version)
        self._barrier.wait()
        return self._pieces[part]

    def snapshot(self, policy_version: int) -> bytes | None:
        return self.worker.snapshot(policy_version)

    def restore(self, snapshot: bytes) -> None:
        self.worker.restore(snapshot)


class RolloutKeeper:
    """Owns a run's rollout actors (as a Ray actor that imports no JAX) and replaces one
    that dies.

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

    def snapshots(self, policy_version: int) -> list[bytes | None]:
        """Every rollout actor's envs as they were before its rollout for
        ``policy_version`` (for a checkpoint)."""
        import ray

        with self._lock:
            actors = list(self.actors)
        return ray.get([actor.snapshot.remote(policy_version) for actor in actors])

    def restore(self, snapshots: list[bytes | None]) -> bool:
        """Put each actor's envs back from a checkpoint; False (nothing changed) if the
        checkpoint had another number of rollout actors or any could not be pickled."""
        import ray

        if len(snapshots) != len(self.actors) or any(s is None for s in snapshots):
            return False
        ray.get([actor.restore.remote(s) for actor, s in zip(self.actors, snapshots,
                                                             strict=True)])
        return True

    def replace(self, index: int, dead_actor_id: str):
        with self._lock:
            if self.actors[index]._actor_id.hex() == dead_actor_id:
                self.replaced += 1
                self.actors[index] = self._start(index)
            return self.actors[index]


class RolloutFeed:
    """One learner's source of batches: its part of a rollout actor's envs, found through
    the keeper, which replaces the actor if it dies (only its batch in flight is lost)."""

    def __init__(self, keeper, index: int, part: int, rank: int) -> None:
        import ray

        self.keeper, self.index, self.part, self.rank = keeper, index, part, rank
        self.actor = ray.get(keeper.actor.remote(index))
        self.replaced = 0
        self._future = None
        self._request = None

    def request(self, policy, version: int) -> None:
        import ray

        self._request = (ray.put(policy), version)
        self._future = self.actor.sample.remote(*self._request, self.part)

    def take(self) -> list[RolloutBatch]:
        import ray

        try:
            return [ray.get(self._future)]
        except ray.exceptions.RayActorError:
            # The rollout actor died: only its batch in flight is lost. Every learner it
            # fed asks the keeper, which starts one replacement for all of them.
            dead = self.actor._actor_id.hex()
            self.actor = ray.get(self.keeper.replace.remote(self.index, dead))
            self.replaced += 1
            log.warning("chip %d: rollout actor %s died; continuing with a new one",
                        self.rank, dead[:8])
            return [ray.get(self.actor.sample.remote(*self._request, self.part))]

    def drain(self) -> None:
        import ray

        if self._future is not None:
            ray.get(self._future)
            self._future = None
