"""Training on a reserved slice: learners pinned one per chip, rollout actors beside them.

The layer that places work. The driver (a notebook kernel or the CLI) starts the actors,
then only watches: learners pull trajectories from their own rollout actors through the
object store and push one metrics record per update to a small board actor. Which
algorithm runs and which mode a chip learns in are data here (the run's plan); the
engine imports neither by name.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from workbench.engine.attempt import Attempt
from workbench.engine.cluster_state import kill_and_wait
from workbench.engine.config import TrainConfig
from workbench.engine.metrics import BoardSnapshot, CurveRow, Evaluation, ReturnWindow
from workbench.engine.plan import RunPlan, check_slice, plan_run, slice_record
from workbench.engine.restarts import ChipLost, hold_intact_slice
from workbench.engine.result import TrainResult
from workbench.engine.shipping import ship_by_value, user_code_of
from workbench.engine.stops import registered
from workbench.engine.warm import (
    board_name,
    board_run,
    keep_board,
    start_board,
    take_board,
)
from workbench.tpu.slice import Slice
from workbench.version import version

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WatchOptions:
    """How the driver watches and steers a run (the keyword arguments of :func:`train`)."""

    on_update: Callable[[dict], None] | None = None
    should_stop: Callable[[], bool] | None = None
    poll_s: float = 0.5
    distributed_timeout_s: float = 120.0
    recover_timeout_s: float = 300.0
    stop_grace_s: float = 4.0


class _Run:
    """One run on one slice, across attempts: the helpers, the attempts, the recovery and
    the result, each a named step of :func:`train`."""

    def __init__(self, tpu_slice: Slice, plan: RunPlan, options: WatchOptions) -> None:
        self.slice = tpu_slice
        self.plan = plan
        self.options = options
        self.stop_event = threading.Event()
        self.started = time.monotonic()
        self.attempt: Attempt | None = None
        self.sync: str | None = None
        self.identity = {**plan.identity, "slice": slice_record(tpu_slice),
                         "workbench": version()}
        self.resume = plan.config.resume
        self.resumed_from: int | None = None
        self.exact_resume: bool | None = None
        self.restarts = 0
        self.env_steps_redone = 0
        self.recovery_s = 0.0
        self.startup_s = 0.0
        self.startup_profile: dict = {}
        self.ended_cleanly = False
        self.loop_start: float | None = None
        self.seen = 0
        self.last_env_steps = 0
        self.history: list[tuple[CurveRow, list[float]]] = []
        """Every row the driver has seen with its episode returns: what a replaced board
        starts from."""
        self.evals: list[Evaluation] = []
        self.helpers_replaced = 0
        self.board = None
        self.tracker = None

    # ---- step 1: the run's folder and the run-wide helpers, off the slice -------------

    def prepare_run_dir(self) -> None:
        from workbench.engine.run_dir import write_run_record
        from workbench.engine.tracking import make_tracker

        write_run_record(self.plan, self.identity)
        config = self.plan.config
        self.tracker = make_tracker(config.track, self.plan.run_dir,
                                    self.identity["run_id"], config.tracking_uri)
        if self.tracker is not None:
            self.tracker.log_config({**dataclasses.asdict(config.replace(algo_config=None)),
                                     "algo_config": self.plan.hyperparameters})

    def start_helpers(self) -> None:
        self.board = self._start_board()

    def _start_board(self, log=None):
        run = board_run(self.plan, self.slice.num_chips, log)
        return take_board(self.slice, run) or start_board(
            self.slice, run, board_name(self.slice, self.helpers_replaced))

    # ---- step 2: an attempt, watched until it ends ------------------------------------

    def run_attempt(self) -> None:
        """Start an attempt on the slice and watch it to its end.

        Raises:
            ChipLost: a learner (or its host) was lost, or the attempt made no progress
                for ``progress_timeout_s``.
        """
        import ray

        from workbench.engine.actors import Checkpoints

        plan = self.plan
        self.attempt = Attempt(self.slice, plan, self.board, self.restarts)
        checkpoints = Checkpoints(plan.checkpoint_dir, self.identity, self.resume)
        setup = self.attempt.start(self.options.distributed_timeout_s, self.sync, checkpoints)
        self.sync = self.attempt.sync
        if self.restarts:
            self.env_steps_redone += max(0, self.last_env_steps - setup.env_steps)
            self.seen = setup.start_update
            self.history = [(row, returns) for row, returns in self.history
                            if row.update <= self.seen]
            ray.get(self.board.rewind.remote(self.seen))
        else:
            if self.resume:
                # A fresh run continuing a checkpoint: its curve goes on from there.
                self.resumed_from, self.exact_resume = setup.start_update, setup.exact
                self.seen = setup.start_update
                window = setup.window or ReturnWindow(self.seen)
                ray.get(self.board.seed.remote(dataclasses.replace(window, update=self.seen)))
            self.startup_s = time.monotonic() - self.started
            self.startup_profile = {**self.attempt.profile, "warm": self.attempt.warm,
                                    "rollouts_warm": self.attempt.rollouts_warm}
        self.attempt.launch()
        self.loop_start = self.loop_start or time.time()
        self._watch()

    def _watch(self) -> None:
        options, config = self.options, self.plan.config
        stop_sent = False
        progress_at = time.monotonic()
        while True:
            finished = self.attempt.finished(options.poll_s)
            snapshot = self._snapshot()
            for row, returns in zip(snapshot.rows, snapshot.returns, strict=True):
                self.seen = row.update
                self.last_env_steps = row.env_steps
                self.history.append((row, returns))
                progress_at = time.monotonic()
                record = row.to_json()
                if self.tracker is not None:
                    self.tracker.log_row(record)
                if options.on_update is not None:
                    options.on_update(record)
            if self.tracker is not None:
                for evaluation in snapshot.evals[len(self.evals):]:
                    self.tracker.log_eval(evaluation.to_json())
            self.evals = snapshot.evals
            wants_stop = (
                self.stop_event.is_set()
                or (options.should_stop is not None and options.should_stop())
                or (config.stop_at_target and snapshot.train_target is not None)
            )
            if wants_stop and not stop_sent:
                self.attempt.request_stop()
                stop_sent = True
            if finished:
                return
            hung_s = time.monotonic() - progress_at
            if config.progress_timeout_s and hung_s > config.progress_timeout_s:
                raise ChipLost(
                    f"no update finished for {hung_s:.0f} s (progress_timeout_s="
                    f"{config.progress_timeout_s:g}): a learner stopped answering"
                )

    def _snapshot(self) -> BoardSnapshot:
        """The board's news since the last row seen, replacing a lost board (it lives on
        the head, off the slice, but a head can lose it too)."""
        import ray

        try:
            snapshot = ray.get(self.board.snapshot.remote(self.seen), timeout=60)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            log.warning("the metrics board was lost; starting a new one from the driver's "
                        "copy of the curve")
            self._replace_board()
            snapshot = ray.get(self.board.snapshot.remote(self.seen), timeout=60)
        return snapshot

    def _replace_board(self) -> None:
        from workbench.engine.metrics import MetricsLog

        rows = [row for row, _ in self.history]
        returns = [r for _, r in self.history]
        log_copy = MetricsLog.replay(self.slice.num_chips, self.plan.target_return, rows,
                                     returns, self.evals)
        self.helpers_replaced += 1
        self.board = self._start_board(log_copy)
        self.attempt.set_board(self.board, self.seen)

    # ---- step 3: recovery after a lost chip ---------------------------------------------

    def recover(self, lost: ChipLost) -> None:
        """Give the slice back, hold an intact one of the same shape, and resume from the
        last checkpoint (from scratch without one).

        Raises:
            ChipLost: past ``max_restarts``.
            SliceUnavailableError: no intact slice came back in time.
        """
        from workbench.engine.checkpoint import latest_step

        self.attempt.kill()
        self.recovery_s += hold_intact_slice(
            self.slice, lost, self.restarts, self.plan.config.max_restarts,
            self.options.recover_timeout_s, limit="config.max_restarts")
        self.restarts += 1
        self.identity = {**self.identity, "slice": slice_record(self.slice)}
        self.resume = latest_step(self.plan.checkpoint_dir) is not None

    # ---- step 4: the result -------------------------------------------------------------

    def _final_evaluation(self, params) -> list:
        """The final policy's greedy episodes, on a new board if the run's was lost after
        the last snapshot that would have noticed (the chips, still up, send it their
        last records again)."""
        import ray

        episodes = self.plan.config.eval_episodes
        try:
            return ray.get(self.board.final_returns.remote(params, episodes))
        except ray.exceptions.RayActorError:
            log.warning("the metrics board was lost; starting a new one for the final "
                        "evaluation")
            self._replace_board()
        return ray.get(self.board.final_returns.remote(params, episodes))

    def assemble_result(self) -> TrainResult:
        import ray

        attempt, config, tpu_slice = self.attempt, self.plan.config, self.slice
        outcomes = ray.get(attempt.runs)
        lead = outcomes[0]
        final = self._final_evaluation(lead.params)
        # Every chip's pushes were sent before its train() returned; read the history.
        summary: BoardSnapshot = ray.get(self.board.snapshot.remote(0, True))
        rows = summary.rows
        loop_end = max(r.time for r in rows) if rows else self.loop_start
        wall_s = loop_end - self.loop_start
        steps_run = sum(row.steps_this_update for row in rows)
        train_target, eval_target = summary.train_target, summary.eval_target
        result = TrainResult(
            env_steps=lead.env_steps,
            wall_s=round(wall_s, 3),
            final_return=float(np.mean(final)),
            env_steps_per_s=round(steps_run / wall_s, 1) if wall_s > 0 else 0.0,
            time_to_eval_target_s=_since(eval_target.time if eval_target else None,
                                         self.loop_start),
            time_to_train_target_s=_since(train_target.time if train_target else None,
                                          self.loop_start),
            env_steps_to_train_target=train_target.env_steps if train_target else None,
            startup_s=round(self.startup_s, 3),
            generation=tpu_slice.shape.generation.name,
            topology=tpu_slice.shape.topology,
            chips=tpu_slice.num_chips,
            hosts=tpu_slice.num_hosts,
            mode=config.mode,
            algo=self.plan.algorithm.name,
            env=config.env,
            sync=self.sync,
            seed=config.seed,
            updates=lead.updates,
            checkpoint=lead.checkpoint,
            run_dir=self.plan.run_dir,
            target_return=self.plan.target_return,
            resumed_from_update=self.resumed_from,
            exact_resume=self.exact_resume,
            restarts=self.restarts,
            env_steps_redone=self.env_steps_redone,
            recovery_s=round(self.recovery_s, 3),
            rollout_actors_per_host=self.plan.rollout_actors_per_host(tpu_slice),
            rollout_actors_replaced=(sum(o.rollouts_replaced for o in outcomes)
                                     + self.attempt.rollouts_replaced_at_setup),
            helpers_replaced=self.helpers_replaced,
            startup_profile=self.startup_profile,
            chip_state_digests=[outcome.digest for outcome in outcomes],
            curve=[row.to_json() for row in rows],
            params=lead.params,
            agent=self.plan.agent(tpu_slice.num_chips),
        )
        from workbench.engine.run_dir import write_result

        write_result(self.plan, result)
        if self.tracker is not None:
            for evaluation in summary.evals[len(self.evals):]:
                self.tracker.log_eval(evaluation.to_json())
            self.tracker.log_result({k: v for k, v in result.to_json().items() if k != "curve"})
        self.ended_cleanly = True
        return result

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
        if self.attempt is not None:
            self.attempt.kill(keep_learners=self.ended_cleanly)
        if self.board is None:
            return
        # A replacement board is not kept: the next run's is found by the first name.
        if not (self.ended_cleanly and not self.helpers_replaced
                and keep_board(self.slice, self.board)):
            kill_and_wait([self.board])


def train(
    tpu_slice: Slice,
    config: TrainConfig | None = None,
    *,
    on_update: Callable[[dict], None] | None = None,
    poll_s: float = 0.5,
    distributed_timeout_s: float = 120.0,
    should_stop: Callable[[], bool] | None = None,
    recover_timeout_s: float = 300.0,
    stop_grace_s: float = 4.0,
) -> TrainResult:
    """Train on every chip of a reserved slice, blocking until the run ends.

    A run survives the loss of a rollout actor (it is replaced; only its batch in flight
    is lost), of its metrics board and evaluator (replaced from the driver's copy), and of
    a learner or a host, or a learner that hangs (the slice is given back, an intact one of
    the same shape is reserved in its place on the same handle, and the run carries on from
    the last checkpoint; ``config.max_restarts`` times at most). An interrupt (Ctrl-C, a
    notebook's KeyboardInterrupt, SIGTERM, interpreter exit) stops it within
    ``stop_grace_s`` after the current update, with a final checkpoint, and re-raises. For
    a run in the background with progress callbacks, use
    :class:`workbench.engine.run.TrainingRun`.

    Args:
        tpu_slice: a slice from :func:`workbench.reserve` (``cpus_per_chip`` at least 2
            in actors mode: a learner and, in some bundles, a rollout actor).
        config: what to learn; defaults to PPO on CartPole-v1 for 500k env steps.
        on_update: called on the driver with each new update's aggregated metrics (after a
            restart, the updates redone from the checkpoint come again).
        poll_s: how often the driver reads the metrics board.
        distributed_timeout_s: deadline for the learners to form one jax.distributed group.
        should_stop: polled with the metrics; returning True ends training cleanly after the
            current update (with a final checkpoint).
        recover_timeout_s: how long to wait for an intact slice after a lost host.
        stop_grace_s: how long an interrupted run may take to stop cleanly.

    Returns:
        The run's :class:`~workbench.engine.result.TrainResult`.

    Raises:
        ValueError: a config, environment, checkpoint or slice that cannot work (nothing
            is started).
        DistributedStartError: the learners did not join in time; names the missing ranks.
        ChipLost: learners were lost more than ``config.max_restarts`` times.
        SliceUnavailableError: no intact slice came back after a loss.
    """
    from workbench.engine.stops import handle_termination

    options = WatchOptions(on_update, should_stop, poll_s, distributed_timeout_s,
                           recover_timeout_s, stop_grace_s)
    plan = plan_run(config or TrainConfig())
    handle_termination()
    return run_planned(tpu_slice, plan, options)


def run_planned(tpu_slice: Slice, plan: RunPlan, options: WatchOptions) -> TrainResult:
    """:func:`train` for a run already planned (the run handle plans in the caller's
    thread, so that a bad config fails there)."""
    check_slice(plan, tpu_slice)
    ship_by_value(user_code_of(plan))
    run = _Run(tpu_slice, plan, options)
    with registered(run.stop_event):
        try:
            run.prepare_run_dir()
            run.start_helpers()
            while True:
                try:
                    run.run_attempt()
                    break
                except ChipLost as lost:
                    run.recover(lost)
                except KeyboardInterrupt:
                    # NOTE: stop after the current update (rank 0 writes a final
                    # checkpoint), within the grace period; a second interrupt ends it.
                    if run.attempt is not None:
                        run.attempt.stop_within(options.stop_grace_s)
                    raise
            return run.assemble_result()
        finally:
            run.close()


def _since(t: float | None, start: float) -> float | None:
    return None if t is None else round(t - start, 3)
