"""One attempt at a run on a reserved slice: its learners, its rollout actors, and how it
ends (finished, stopped, or a chip lost)."""

from __future__ import annotations

import contextlib
import logging
import time

from workbench.engine.actors import Checkpoints, LearnerReady
from workbench.engine.chip_group import attempt_prefix
from workbench.engine.cluster_state import wait_until_dead
from workbench.engine.plan import RunPlan
from workbench.engine.restarts import ChipLost
from workbench.engine.rollouts import FeedSpec, rollout_layout, rollout_runs, start_keeper
from workbench.engine.warm import LearnerGroup, keep, start_group, take
from workbench.learn import sync as sync_strategies
from workbench.learn.joined_mesh import MeshMismatchError

log = logging.getLogger(__name__)


class Attempt:
    """The learners (and rollout actors) of one attempt at a run on the slice."""

    def __init__(self, tpu_slice, plan: RunPlan, board, number: int) -> None:
        # Actors are named "<slice>:a<attempt>:learner-<rank>" and "...:rollout-<i>" so
        # that a person (or a fault test) can find them with ray.get_actor.
        self.prefix = attempt_prefix(tpu_slice, number)
        self.slice = tpu_slice
        self.plan = plan
        self.board = board
        self.learners: list = []
        self.keeper = None
        self.number = number
        self.group: LearnerGroup | None = None
        self.warm = False
        """Whether the learners were kept warm from an earlier run on the slice."""
        self.profile: dict[str, float] = {}
        """Seconds from the attempt's start until its learners had joined, were set up,
        and had compiled."""
        self.runs: list = []
        self.sync: str | None = None
        self.rollouts_warm = False
        """Whether the rollout actors were kept from an earlier run on the slice."""
        self.rollouts_replaced_at_setup = 0
        """Kept rollout actors found dead when this attempt set them up, and replaced."""
        self._rollouts_set_up = None

    def start(self, distributed_timeout_s: float, sync: str | None,
              checkpoints: Checkpoints) -> LearnerReady:
        """Start every chip's learner, join them, set up (resuming from ``checkpoints``
        when they say so) and compile. Returns rank 0's answer to its setup. ``sync`` is
        the strategy resolved by an earlier attempt; the first resolves it from the
        learners' platform."""
        import ray

        started = time.monotonic()
        tpu_slice, config = self.slice, self.plan.config
        num_chips = tpu_slice.num_chips
        self.group = take(tpu_slice) if self.number == 0 else None
        self.warm = self.group is not None
        if self.group is None:
            self.group = start_group(tpu_slice, self.number, distributed_timeout_s)
        self.learners = self.group.learners
        feeds = self._start_rollouts()
        platform = self.group.wait_joined(distributed_timeout_s)
        self.sync = sync or sync_strategies.resolve(config.sync, platform)
        self.profile["learners_joined_s"] = round(time.monotonic() - started, 3)
        log.info("learners %s after %.1f s", "taken warm" if self.warm else "joined",
                 time.monotonic() - started)
        setup = self.plan.learner_setup(num_chips, self.sync)
        setups: list[LearnerReady] = _get_raising_users_errors([
            lr.setup.remote(config, setup, config.mode, feed, self.board, checkpoints)
            for lr, feed in zip(self.learners, feeds, strict=True)
        ])
        seen = sorted({answer.devices for answer in setups})
        if seen != [num_chips]:
            raise MeshMismatchError(
                f"The learners of the {tpu_slice.shape.label} slice see {seen} devices, not "
                f"its {num_chips} chips. Run `workbench doctor --mesh` on this cluster."
            )
        self.profile["learners_set_up_s"] = round(time.monotonic() - started, 3)
        ray.get([lr.compile.remote() for lr in self.learners], timeout=600)
        if self._rollouts_set_up is not None:
            self.rollouts_replaced_at_setup = _get_raising_users_errors(self._rollouts_set_up)
        self.profile["compiled_s"] = round(time.monotonic() - started, 3)
        log.info("learners ready after %s", self.profile)
        return setups[0]

    def _start_rollouts(self) -> list[FeedSpec | None]:
        """Rollout actors for the run, laid out by :func:`rollout_layout`: the ones kept on
        the slice when they fit, set up for this run in the background, else new ones. A
        mode without host rollouts (Anakin) starts none."""
        tpu_slice, plan = self.slice, self.plan
        config = plan.config
        if not plan.host_rollouts:
            return [None] * tpu_slice.num_chips
        layout = rollout_layout(tpu_slice, self.prefix, plan.rollout_actors_per_host(tpu_slice),
                                config.policy_lag)
        runs = rollout_runs(plan, layout, tpu_slice.num_chips)
        self.keeper = self.group.rollouts_for(layout)
        self.rollouts_warm = self.keeper is not None
        if self.rollouts_warm:
            self._rollouts_set_up = self.keeper.setup.remote(runs)
        else:
            self.keeper = start_keeper(tpu_slice, layout, runs)
            self.group.hold_rollouts(self.keeper, layout)
        return [FeedSpec(self.keeper, layout.fed_by[rank])
                for rank in range(tpu_slice.num_chips)]

    def launch(self) -> None:
        self.runs = [lr.train.remote() for lr in self.learners]

    def set_board(self, board, since: int) -> None:
        """Point every learner at a new metrics board, which gets their records of updates
        after ``since`` again."""
        import ray

        ray.get([lr.set_board.remote(board, since) for lr in self.learners], timeout=30)

    def request_stop(self) -> None:
        import ray

        # Rank 0's flag reaches every chip through the update's own collective.
        ray.get(self.learners[0].request_stop.remote(), timeout=30)

    def finished(self, poll_s: float) -> bool:
        """Whether every learner's loop has ended; raises ``ChipLost`` if one died."""
        import ray

        done, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=poll_s)
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as error:
                raise ChipLost(f"learner of rank {self.runs.index(ref)} died: {error}") from None
            except ray.exceptions.RayTaskError as error:
                lost = self._lost_learners()
                if lost:
                    raise ChipLost(f"learners {lost} died") from error
                raise
        return len(done) == len(self.runs)

    def stop_within(self, grace_s: float) -> None:
        """Ask the learners to stop after the current update and wait up to ``grace_s``."""
        import ray

        if self.runs:
            with contextlib.suppress(Exception):
                self.request_stop()
                ray.wait(self.runs, num_returns=len(self.runs), timeout=grace_s)

    def _lost_learners(self, answer_s: float = 10.0, death_s: float = 60.0) -> list[int]:
        """Ranks of learners that are gone, after a collective failed.

        A chip's loss shows first, in the others, as a failed collective; Ray marks the
        lost learner dead only once its host misses enough health checks (tens of seconds
        with Ray's defaults). Learners that still answer are alive; one that does not is
        waited on until Ray lists it dead (or ``death_s`` passes, and it counts as lost)."""
        import ray

        pings = [lr.__ray_ready__.remote() for lr in self.learners]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=answer_s)
        silent = []
        for rank, ping in enumerate(pings):
            try:
                if ping not in ready:
                    silent.append(rank)
                else:
                    ray.get(ping)
            except ray.exceptions.RayActorError:
                silent.append(rank)
        wait_until_dead([self.learners[rank]._actor_id.hex() for rank in silent], death_s)
        return silent

    def kill(self, keep_learners: bool = False) -> None:
        """Stop the attempt's actors; with ``keep_learners`` (a run that ended cleanly),
        the learners and rollout actors stay on the slice for its next run if the slice
        keeps them."""
        if self.group is None:
            return
        if keep_learners and keep(self.slice, self.group):
            return
        self.group.kill()


def _get_raising_users_errors(refs, timeout_s: float = 600.0):
    """``ray.get(refs)``, where a user's error raised in an actor (a checkpoint or an env
    that does not fit) reads as itself, not as a remote traceback."""
    import ray

    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, ValueError):
            raise error.cause from None
        raise
