"""Rollout actors on the hosts' CPUs, and the keeper that replaces one that dies.

A rollout actor steps one set of gymnasium vector envs for several learners of its host
with one policy forward per step (a :class:`~workbench.learn.rollout.RolloutWorker`); each
learner reaches it through a :class:`RolloutFeed`, its side of the actors-mode
:class:`~workbench.learn.actors_mode.TrajectorySource`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from workbench.engine.cluster_state import CPU_ONLY, kill_and_wait, remote
from workbench.learn.rollout import RolloutBatch, RolloutWorker

log = logging.getLogger(__name__)

SET_UP_WAIT_S = 600.0
"""How long a checkpoint's snapshot or restore waits for the rollout actors' set-up."""


@dataclass(frozen=True)
class RolloutSeat:
    """Which rollout actor feeds a chip, and which of its parts is the chip's."""

    index: int
    """The actor's index among the slice's rollout actors."""
    part: int
    """The chip's part of that actor's envs (its rank among the chips the actor feeds)."""


@dataclass(frozen=True)
class RolloutKey:
    """What rollout actors kept from a run must share with the next run to serve it."""

    per_host: int
    """Rollout actors on each host."""
    policy_lag: int
    """Rollouts a learner may have asked for at once (the actors' threads are sized by
    it)."""


@dataclass(frozen=True)
class RolloutLayout:
    """Where a slice's rollout actors sit and which chips each one feeds."""

    options: list[dict]
    """Each actor's Ray options: in the bundle of the first chip it feeds, named
    ``<prefix>:rollout-<i>``."""
    fed_by: dict[int, RolloutSeat]
    """Chip rank -> the actor and part that feed it."""
    share: int
    """Chips (parts) per actor."""
    key: RolloutKey
    """Actors kept from a run serve a run with the same."""
    keeper_name: str
    """``<prefix>:rollouts``, the :class:`RolloutKeeper`'s name."""


@dataclass(frozen=True)
class RolloutRun:
    """One rollout actor's part of a run (what :meth:`SharedRollout.setup` takes)."""

    env_id: Any
    """The env's id or reference (:attr:`~workbench.engine.plan.RunPlan.env_ref`)."""
    envs_per_part: int
    """Envs stepped for each chip the actor feeds."""
    parts: int
    """Chips the actor feeds."""
    rollout_length: int
    agent: Any
    """The run's :class:`~workbench.learn.learner.AgentSpec`."""
    seed: int
    index: int
    """The actor's index among the slice's rollout actors (its envs' seeds follow)."""
    policy_lag: int = 1
    wrappers: tuple = ()
    wait_s: float = 600.0
    """How long a part's request waits for the others of its rollout."""


@dataclass(frozen=True)
class FeedSpec:
    """Where one chip's learner finds its rollouts (what it builds a :class:`RolloutFeed`
    from)."""

    keeper: Any
    """The slice's :class:`RolloutKeeper` actor."""
    seat: RolloutSeat


@dataclass(frozen=True)
class Replacement:
    """The keeper's answer to a learner whose rollout actor died."""

    actor: Any
    """The actor that stands for the dead one."""
    started: bool
    """Whether this request started it (the first of the actor's learners to ask)."""


@dataclass(frozen=True)
class RolloutRequest:
    """A batch a learner asked its rollout actor for, kept until it is taken so that it
    can be asked for again of a replacement."""

    policy: Any
    """A reference to the policy's parameters in the object store."""
    policy_version: int
    for_update: int


def rollout_layout(tpu_slice, prefix: str, per_host: int, policy_lag: int) -> RolloutLayout:
    """Each host's chips split among ``per_host`` rollout actors, which serve their chips'
    learners in rank order, with a thread for every request those learners can have in
    flight and one for checkpoint snapshots."""
    share = tpu_slice.shape.chips_per_host // per_host
    options: list[dict] = []
    fed_by: dict[int, RolloutSeat] = {}
    for host in tpu_slice.hosts:
        for k in range(per_host):
            ranks = host.chips[k * share:(k + 1) * share]
            index = len(options)
            options.append(dict(num_cpus=1, runtime_env=CPU_ONLY,
                                max_concurrency=share * policy_lag + 1,
                                scheduling_strategy=tpu_slice.scheduling(ranks[0]),
                                name=f"{prefix}:rollout-{index}"))
            for part, rank in enumerate(ranks):
                fed_by[rank] = RolloutSeat(index, part)
    return RolloutLayout(options, fed_by, share, RolloutKey(per_host, policy_lag),
                         f"{prefix}:rollouts")


def rollout_runs(plan, layout: RolloutLayout, num_chips: int) -> list[RolloutRun]:
    """Each rollout actor's part of a run of ``plan`` (a
    :class:`~workbench.engine.plan.RunPlan`)."""
    config = plan.config
    agent = plan.agent(num_chips)
    return [RolloutRun(env_id=plan.env_ref, envs_per_part=config.envs_per_chip,
                       parts=layout.share, rollout_length=config.rollout_length, agent=agent,
                       seed=config.seed, index=index, policy_lag=config.policy_lag,
                       wrappers=config.wrappers)
            for index in range(len(layout.options))]


def start_keeper(tpu_slice, layout: RolloutLayout, runs: list[RolloutRun] | None = None):
    """A :class:`RolloutKeeper` for ``layout`` (on rank 0's bundle, no CPU of its own),
    its actors given ``runs`` or, without, started empty for a later run."""
    return remote(RolloutKeeper, num_cpus=0, max_concurrency=len(layout.fed_by) + 2).options(
        scheduling_strategy=tpu_slice.scheduling(0), name=layout.keeper_name,
    ).remote(layout.options, runs)


def stop_keepers(keepers: list, others: list) -> None:
    """Kill ``keepers`` with their rollout actors, and ``others``, and wait until the
    cluster lists all of them dead."""
    import ray

    rollout_ids: list[str] = []
    for keeper in keepers:
        with contextlib.suppress(Exception):
            rollout_ids += ray.get(keeper.stop_all.remote(), timeout=10)
    kill_and_wait(list(others) + list(keepers), rollout_ids)


class SharedRollout:
    """A rollout actor feeding several learners of one host from one set of envs.

    Each learner asks for its part of the rollout for an update; when all have asked, one
    policy forward per step serves every learner's envs, and each learner gets its
    columns. Learners may have several updates' rollouts asked for at once (a policy lag):
    rollouts run one at a time, oldest update first, so the envs advance the same way in
    every run. Run as a Ray actor with one thread per request that can be in flight.
    """

    def __init__(self, run: RolloutRun | None = None) -> None:
        import jax  # noqa: F401  (imported now: an actor kept between runs starts no import)

        from workbench.learn.platform import use_compile_cache

        # Its policy programs are the same run after run: kept, not compiled each start.
        use_compile_cache()
        self._cond = threading.Condition()
        self.worker: RolloutWorker | None = None
        if run is not None:
            self.setup(run)

    def setup(self, run: RolloutRun) -> None:
        """Make this actor a run's: its envs, its policy, its seed. An actor kept from an
        earlier run (see :class:`RolloutKeeper`) keeps nothing of it but the process."""
        self.worker = RolloutWorker(run.env_id, run.envs_per_part * run.parts,
                                    run.rollout_length, run.agent, run.seed, run.index,
                                    keep_snapshots=run.policy_lag + 1, wrappers=run.wrappers)
        # Compiled now, while the learners start, not in the first rollout.
        self.worker.prepare()
        self.parts = run.parts
        self.wait_s = run.wait_s
        self._forget_requests()

    def _forget_requests(self) -> None:
        with self._cond:
            self._asked: dict[int, dict[int, tuple]] = {}
            """for_update -> part -> (policy, policy_version): who has asked for what."""
            self._done: dict[int, list[RolloutBatch]] = {}
            self._collected: dict[int, set[int]] = {}
            self._running = False

    def clear(self) -> None:
        """Drop the finished run's envs and batches; the process stays for the next run."""
        import gc

        from workbench.learn.heap import release_freed_memory

        self.worker = None
        self._forget_requests()
        gc.collect()
        release_freed_memory()

    def sample(self, policy, policy_version: int, for_update: int, part: int) -> RolloutBatch:
        """Part ``part`` of the rollout for update ``for_update`` (every part passes the
        same policy for it)."""
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            self._asked.setdefault(for_update, {})[part] = (policy, policy_version)
            self._cond.notify_all()
            while for_update not in self._done:
                oldest = min(self._asked) if self._asked else None
                # NOTE: the oldest update asked for runs first, once every part has asked
                # for it, and one rollout at a time: the envs see the same actions in the
                # same order in every run, whatever order the requests arrived in.
                if not self._running and oldest is not None and self._ready(oldest):
                    self._run(oldest)
                    continue
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"rollout for update {for_update}: not every learner "
                                       f"asked within {self.wait_s:g} s")
            pieces = self._done[for_update]
            taken = self._collected.setdefault(for_update, set())
            taken.add(part)
            if len(taken) == self.parts:
                del self._done[for_update], self._collected[for_update]
            return pieces[part]

    def _ready(self, update: int) -> bool:
        """Whether the rollout for ``update`` can run: every part asked for it, or (in a
        replacement for an actor that died) every part asked for it or for a later update,
        a part that asks for a later one having had this one from the dead actor."""
        if len(self._asked[update]) == self.parts:
            return True
        waiting = {part for asked in self._asked.values() for part in asked}
        return len(waiting) == self.parts

    def _run(self, for_update: int) -> None:
        """Make one rollout (called holding the lock, which it releases while stepping)."""
        asked = self._asked.pop(for_update)
        # Every part passes the same policy for an update (the learners hold the same
        # parameters); pieces nobody asked for here are never taken.
        policy, policy_version = next(iter(asked.values()))
        self._collected[for_update] = set(range(self.parts)) - set(asked)
        self._running = True
        self._cond.release()
        try:
            pieces = self.worker.sample(policy, policy_version, for_update).split(self.parts)
        finally:
            self._cond.acquire()
            self._running = False
        self._done[for_update] = pieces
        self._cond.notify_all()

    def snapshot(self, for_update: int) -> bytes | None:
        return self.worker.snapshot(for_update)

    def restore(self, snapshot: bytes) -> bool:
        return self.worker.restore(snapshot)


class RolloutKeeper:
    """Owns a slice's rollout actors (as a Ray actor that imports no JAX) and replaces one
    that dies.

    Learners find their rollout actor here; when one dies, each learner it fed asks for
    a replacement and all of them get the same new actor. A slice that keeps its learners
    between runs keeps its keeper and rollout actors with them: each run gives them its
    own envs and policy (:meth:`setup`) and takes them back empty (:meth:`clear`).
    """

    def __init__(self, options: list[dict], runs: list[RolloutRun] | None = None) -> None:
        import ray

        self._cls = ray.remote(SharedRollout)
        self._options = options
        self._runs = runs
        self._lock = threading.Lock()
        self._set_up = threading.Event()
        """Set while every actor holds the current run (snapshots and restores wait)."""
        if runs is not None:
            self._set_up.set()
        self.replaced = 0
        self.actors = [self._start(i) for i in range(len(options))]

    def _start(self, index: int):
        options = self._options[index]
        if self.replaced:
            options = {**options, "name": f"{options['name']}.{self.replaced}"}
        run = self._runs[index] if self._runs is not None else None
        return self._cls.options(**options).remote(run)

    def setup(self, runs: list[RolloutRun]) -> int:
        """Give every actor its part of a new run (``runs[i]``: actor ``i``'s); an actor
        found dead is replaced. Returns how many were."""
        import ray

        replaced = 0
        self._set_up.clear()
        try:
            with self._lock:
                self._runs = runs
                calls = [actor.setup.remote(run)
                         for actor, run in zip(self.actors, runs, strict=True)]
            for index, call in enumerate(calls):
                try:
                    ray.get(call)
                except ray.exceptions.RayActorError:
                    replaced += 1
                    with self._lock:
                        self.replaced += 1
                        self.actors[index] = self._start(index)
        finally:
            self._set_up.set()
        return replaced

    def clear(self) -> None:
        """Empty every actor after a run (raises if one is gone: then none is kept)."""
        import ray

        self._runs = None
        ray.get([actor.clear.remote() for actor in self.actors], timeout=30)

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

    def snapshots(self, for_update: int) -> list[bytes | None]:
        """Every rollout actor's envs as they were before its rollout for update
        ``for_update`` (for a checkpoint)."""
        import ray

        self._set_up.wait(SET_UP_WAIT_S)
        with self._lock:
            actors = list(self.actors)
        return ray.get([actor.snapshot.remote(for_update) for actor in actors])

    def restore(self, snapshots: list[bytes | None]) -> bool:
        """Put each actor's envs back from a checkpoint; False (nothing changed) if the
        checkpoint had another number of rollout actors or any could not be pickled."""
        import ray

        self._set_up.wait(SET_UP_WAIT_S)
        if len(snapshots) != len(self.actors) or any(s is None for s in snapshots):
            return False
        return all(ray.get([actor.restore.remote(s)
                            for actor, s in zip(self.actors, snapshots, strict=True)]))

    def replace(self, index: int, dead_actor_id: str) -> Replacement:
        """The actor that stands for the dead one, and whether this call started it (the
        first of the learners it fed to ask, unless :meth:`setup` replaced it already)."""
        with self._lock:
            started = self.actors[index]._actor_id.hex() == dead_actor_id
            if started:
                self.replaced += 1
                self.actors[index] = self._start(index)
            return Replacement(self.actors[index], started)


class RolloutFeed:
    """One learner's source of batches: its part of a rollout actor's envs, found through
    the keeper, which replaces the actor if it dies (only its batches in flight are lost,
    and asked for again from the new one)."""

    def __init__(self, spec: FeedSpec, rank: int) -> None:
        import ray

        self.keeper, self.rank = spec.keeper, rank
        self.index, self.part = spec.seat.index, spec.seat.part
        self.actor = ray.get(self.keeper.actor.remote(self.index))
        self.replaced = 0
        self._in_flight: deque[tuple[RolloutRequest, Any]] = deque()
        """(request, future) of every batch asked for, oldest first."""

    def _ask(self, request: RolloutRequest):
        # NOTE: the policy's reference goes as an argument of its own, not inside the
        # request: Ray hands an actor the value only of references passed at the top.
        return self.actor.sample.remote(request.policy, request.policy_version,
                                        request.for_update, self.part)

    def request(self, policy, policy_version: int, for_update: int) -> None:
        import ray

        request = RolloutRequest(ray.put(policy), policy_version, for_update)
        self._in_flight.append((request, self._ask(request)))

    def take(self) -> list[RolloutBatch]:
        import ray

        asked, future = self._in_flight[0]
        try:
            batch = ray.get(future)
        except ray.exceptions.RayActorError:
            # The rollout actor died: its batches in flight are lost. Every learner it fed
            # asks the keeper, which starts one replacement for all of them, and asks it
            # again for the same updates with the same policies.
            dead = self.actor._actor_id.hex()
            replacement = ray.get(self.keeper.replace.remote(self.index, dead))
            self.actor = replacement.actor
            self.replaced += replacement.started
            log.warning("chip %d: rollout actor %s died; continuing with a new one",
                        self.rank, dead[:8])
            self._in_flight = deque((request, self._ask(request))
                                    for request, _ in self._in_flight)
            batch = ray.get(self._in_flight[0][1])
        self._in_flight.popleft()
        return [batch]

    def drain(self) -> None:
        import ray

        while self._in_flight:
            _, future = self._in_flight.popleft()
            ray.get(future)
