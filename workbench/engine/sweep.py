"""Sweeps on a reserved slice: many seeds and a grid of hyperparameters in one program.

In Anakin mode every trial (a grid point with a seed) is a whole training run on one
chip's worth of environments, and a chip steps its share of the trials together in one
compiled program (:mod:`workbench.learn.trials`): 64 seeds cost one compile and run side
by side. Trials whose configs differ in more than the program's values (a width, a count)
run as programs of their own, one after another. In actors mode each trial is a full run on
the slice, queued, each with its own seed.

Every trial keeps its own curve and result, and the sweep record gives per-config
statistics (mean, interquartile mean, 95% bootstrap intervals) of the final return and of
the time to the target. Like a run, a sweep only watches: the chips push one record per
update to a small board actor, which the driver polls.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.engine.chip_group import issue_joins, start_chip_actors, wait_for_joins
from workbench.engine.cluster_state import CPU_ONLY, head_node_affinity, kill_and_wait, remote
from workbench.engine.config import TrainConfig
from workbench.engine.fields import ConfigError
from workbench.engine.metrics import CurveRow, MetricsLog, UpdateRecord
from workbench.engine.result import TrainResult
from workbench.engine.statistics import curve_band, summarize
from workbench.engine.sweep_plan import (
    GridPoint,
    ProgramGroup,
    Trial,
    grid_points,
    group_trials,
    parse_seeds,
    trials_of,
)
from workbench.engine.warm import stop_kept_learners

log = logging.getLogger(__name__)

TrialCallback = Callable[[int, dict], None]


@dataclass
class SweepResult:
    """What a sweep did: every trial's result, and statistics per grid point."""

    generation: str
    topology: str
    chips: int
    hosts: int
    mode: str
    algo: str
    env: str
    seeds: list[int]
    grid: dict[str, list]
    target_return: float | None
    trials: list[dict]
    """One record per trial: ``trial``, ``config``, ``seed``, ``overrides``,
    ``final_return``, ``time_to_train_target_s``, ``env_steps_to_train_target``,
    ``mean_return_100`` (at the end) and its ``curve``."""
    configs: list[dict]
    """One record per grid point: its ``overrides`` and the statistics of its trials'
    ``final_return`` and ``time_to_train_target_s`` (``count``, ``missing``, ``mean``,
    ``iqm``, ``mean_ci``, ``iqm_ci``), and how many reached the target."""
    programs: int
    """Compiled programs the sweep ran (one per group of trials that share one)."""
    startup_s: float
    wall_s: float
    """Seconds of the trials' loops, summed over programs run one after another."""
    env_steps: int
    """Env steps over every trial."""
    env_steps_per_s: float
    run_dir: str | None = None
    stopped: bool = False
    restarts: int = 0
    """Programs run again from their start after a chip failed or stopped answering."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def plot(self, path: str | None = None, ax=None):
        """One band per grid point: the IQM of the trials' rolling return, between their
        25th and 75th percentiles, against env steps. Saved to ``path`` when given."""
        if ax is None:
            # A bare Figure, not pyplot's: no global backend switch, and a notebook still
            # shows it when it is a cell's value.
            from matplotlib.figure import Figure

            figure = Figure(figsize=(7, 4))
            ax = figure.subplots()
        else:
            figure = ax.figure
        draw_bands(ax, self.trials, self.configs, self.target_return)
        if path:
            figure.savefig(path, dpi=100, bbox_inches="tight")
        return figure


def bands_of(trials: Sequence[dict], configs: Sequence[dict]) -> list[dict]:
    """Per grid point: env steps and the IQM band of its trials' rolling mean return."""
    out = []
    for config in configs:
        curves = [t["curve"] for t in trials if t["config"] == config["config"] and t["curve"]]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        values = [[np.nan if r["mean_return_100"] is None else r["mean_return_100"]
                   for r in c[:length]] for c in curves]
        steps = [r["env_steps"] for r in curves[0][:length]]
        out.append({"label": config["label"], "env_steps": steps, **curve_band(values)})
    return out


def draw_bands(ax, trials: Sequence[dict], configs: Sequence[dict],
               target: float | None) -> None:
    ax.clear()
    for band in bands_of(trials, configs):
        line, = ax.plot(band["env_steps"], band["iqm"], label=band["label"])
        ax.fill_between(band["env_steps"], band["low"], band["high"], alpha=0.25,
                        color=line.get_color())
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
    ax.set_xlabel("env steps (per trial)")
    ax.set_ylabel("mean return, last 100 episodes")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=8)


# ---- the board and the per-chip actor ----------------------------------------------------

@dataclass(frozen=True)
class TrialRecord:
    """What a chip reports of one of its trials after one update of the program."""

    trial: int
    """The trial's index in its program's group (not in the whole sweep)."""
    update: int
    time: float
    env_steps: int
    """The trial's env steps so far."""
    steps: int
    """Env steps this update added to the trial."""
    returns: list[float]
    """Returns of the trial's episodes that finished in the update."""
    metrics: dict[str, float]
    step_s: float
    """Seconds of the update (of every trial of the chip together)."""


@dataclass(frozen=True)
class TrialsOutcome:
    """What a chip answers when its share of a program's trials has ended."""

    final: dict[int, float]
    """Mean greedy return of each of its trials, by index in the program's group."""
    updates: int


class SweepBoard:
    """Where every chip's per-update trial records go; the driver reads them in order."""

    def __init__(self) -> None:
        self.records: list[TrialRecord] = []
        self._lock = threading.Lock()

    def record(self, records: list[TrialRecord]) -> None:
        with self._lock:
            self.records.extend(records)

    def since(self, index: int) -> list[TrialRecord]:
        with self._lock:
            return self.records[index:]


class TrialsActor:
    """One chip's share of a sweep's trials (a Ray actor pinned to the chip's bundle)."""

    def __init__(self, rank: int, num_chips: int) -> None:
        from workbench.engine.actors import ChipLearnerActor

        self.chip = ChipLearnerActor(rank, num_chips)
        self.rank = rank
        self._stop = False

    def describe_process(self):
        return self.chip.describe_process()

    def join(self, shape, timeout_s: float, *processes):
        return self.chip.join(shape, timeout_s, *processes)

    def setup(self, setup) -> float:
        """Build and compile this chip's share; returns the compile seconds."""
        from workbench.learn.trials import TrialsLearner

        self.learner = TrialsLearner(setup)
        return self.learner.compile()

    def request_stop(self) -> None:
        self._stop = True

    def run(self, board, num_updates: int, steps_per_update: int) -> TrialsOutcome:
        """Every update of this chip's trials, each pushed to ``board``; then a greedy
        evaluation of each trial."""
        learner = self.learner
        for update in range(num_updates):
            if self._stop:
                break
            metrics, returns, step_s = learner.step()
            now = time.time()
            board.record.remote([
                TrialRecord(trial=trial, update=update + 1, time=now,
                            env_steps=(update + 1) * steps_per_update, steps=steps_per_update,
                            returns=returns[trial], metrics=metrics[trial], step_s=step_s)
                for trial in learner.local_trials
            ])
        return TrialsOutcome(final=learner.final_returns(), updates=learner.updates)


# ---- the sweep ---------------------------------------------------------------------------

class SweepFailed(RuntimeError):
    """A chip of a sweep's program failed, or the chips stopped sending updates; the
    program's actors are stopped."""


def _raise_if_failed(runs: list, finished: list) -> None:
    """Raise SweepFailed for the first of ``finished`` (chips' runs that just ended) that
    failed: the other chips may be waiting for it in a collective, or be taken down with
    it."""
    import ray

    for run in finished:
        try:
            ray.get(run)
        except ray.exceptions.RayError as error:
            reason = (str(error).strip().splitlines() or [""])[0]
            raise SweepFailed(f"The sweep's chip {runs.index(run)} failed: "
                              f"{type(error).__name__}: {reason}") from error


@dataclass(frozen=True)
class _TrialCurve:
    """A trial's curve as its record gives it, and when it first reached the target."""

    rows: list[dict]
    time_to_train_target_s: float | None = None
    env_steps_to_train_target: int | None = None
    mean_return_100: float | None = None
    """At the end."""


@dataclass
class _Curves:
    """The driver's per-trial logs (Anakin programs) and results (queued runs), by the
    trial's index in the sweep."""

    target: float | None
    logs: dict[int, MetricsLog] = field(default_factory=dict)
    loop_start: dict[int, float] = field(default_factory=dict)
    runs: dict[int, TrainResult] = field(default_factory=dict)
    """The result of each queued trial's run."""

    def add(self, trial: int, record: TrialRecord) -> list[CurveRow]:
        """Take one update's record of ``trial``; returns the rows it completed."""
        log_ = self.logs.setdefault(trial, MetricsLog(1, self.target))
        self.loop_start.setdefault(trial, record.time - record.step_s)
        closed = len(log_.curve)
        log_.add(UpdateRecord(update=record.update, rank=0, time=record.time,
                              env_steps=record.env_steps, steps=record.steps,
                              episode_returns=record.returns, step_s=record.step_s,
                              metrics=record.metrics))
        return log_.curve[closed:]

    def forget(self, trial: int) -> None:
        """Drop a trial's log: its program runs again from the start."""
        self.logs.pop(trial, None)
        self.loop_start.pop(trial, None)

    def of(self, trial: int) -> _TrialCurve:
        """What the sweep's record says of ``trial``'s curve."""
        run = self.runs.get(trial)
        if run is not None:
            # The run measured its own time to target, from its loop's start.
            hit = run.time_to_train_target_s
            return _TrialCurve(
                list(run.curve), None if hit is None else round(hit, 3),
                run.env_steps_to_train_target if hit is not None else None,
                run.curve[-1]["mean_return_100"] if run.curve else None)
        log_ = self.logs.get(trial)
        if log_ is None:
            return _TrialCurve([])
        target, start = log_.target_row, self.loop_start.get(trial)
        return _TrialCurve(
            log_.rows,
            round(target.time - start, 3) if target is not None and start is not None
            else None,
            target.env_steps if target is not None else None,
            log_.curve[-1].mean_return_100 if log_.curve else None)


def sweep(tpu_slice, config: TrainConfig | None = None, *,
          seeds: str | int | Sequence[int] = 8,
          grid: Mapping[str, Sequence[Any]] | None = None,
          on_update: TrialCallback | None = None,
          should_stop: Callable[[], bool] | None = None,
          distributed_timeout_s: float = 120.0, poll_s: float = 0.5) -> SweepResult:
    """Train every seed of every grid point on the slice, and report per-config statistics.

    Blocks until the sweep ends; :class:`workbench.engine.run.SweepRun` runs one in the
    background (the sweep dashboard watches one).

    Args:
        tpu_slice: a reserved slice.
        config: the base run; ``mode="anakin"`` vmaps trials on the chips, ``"actors"``
            queues them as runs.
        seeds: ``"0-63"``, ``"0,1,2"``, a count (``8``: seeds 0..7) or a list.
        grid: ``{"ppo.learning_rate": [1e-3, 5e-4], "gamma": [0.99]}``: fields of the
            algorithm's config (optionally prefixed with its name) or of ``TrainConfig``.
        on_update: called on the driver with ``(trial, row)`` for each trial's update.
        should_stop: polled; True ends the sweep after the current update.
        distributed_timeout_s: deadline for the chips to form one jax.distributed group.
        poll_s: how often the driver reads the board.

    ``config.track`` tracks every trial as a run of its own (in ``trial-NNNN/`` of the
    sweep's folder for TensorBoard).

    Returns:
        The :class:`SweepResult` (also written to ``<run_dir>/sweep.json``).

    Raises:
        ValueError: a grid over a field that does not exist, a value of the wrong type, or
            more trials than the chips' memory holds (nothing is started).
    """
    plan = plan_sweep(tpu_slice, config or TrainConfig(mode="anakin"), seeds, grid)
    return run_sweep(tpu_slice, plan, on_update=on_update, should_stop=should_stop,
                     distributed_timeout_s=distributed_timeout_s, poll_s=poll_s)


def run_sweep(tpu_slice, plan: SweepPlan, *, on_update: TrialCallback | None = None,
              should_stop: Callable[[], bool] | None = None,
              distributed_timeout_s: float = 120.0, poll_s: float = 0.5) -> SweepResult:
    """:func:`sweep` for a sweep already planned (:func:`plan_sweep`)."""
    from workbench.engine.stops import registered

    stop = threading.Event()

    def wants_stop() -> bool:
        return stop.is_set() or (should_stop is not None and bool(should_stop()))

    # SIGTERM and interpreter exit stop a sweep after its current update, as they do a run.
    with registered(stop):
        return _SweepRun(tpu_slice, plan, on_update, wants_stop, distributed_timeout_s,
                         poll_s).run()


@dataclass(frozen=True)
class SweepPlan:
    config: TrainConfig
    seeds: tuple[int, ...]
    grid: dict[str, list]
    points: list[GridPoint]
    trials: list[Trial]
    groups: list[ProgramGroup]
    target_return: float | None
    run_dir: str


def plan_sweep(tpu_slice, config: TrainConfig, seeds, grid) -> SweepPlan:
    """Validate a sweep and lay out its trials (see :func:`sweep` for the arguments).

    Raises:
        ValueError: what cannot work, naming the field, value or limit.
    """
    from workbench.engine.plan import plan_run, runs_root
    from workbench.learn.trials import bytes_per_trial

    config.validate()
    if config.resume:
        raise ConfigError("resume", "is not supported by sweeps: start the sweep afresh.")
    seed_list = parse_seeds(seeds)
    grid = {k: list(v) for k, v in (grid or {}).items()} if grid else {}
    points = grid_points(config, grid)
    for point in points:
        plan_run(point.config.replace(run_dir=None))  # env, algorithm and spaces checked
    trials = trials_of(points, seed_list)
    groups = group_trials(trials, list(grid)) if config.mode == "anakin" else []
    groups = [split for g in groups for split in _split_untraceable(g)]
    for group in groups:
        check_memory(tpu_slice.shape, len(group.trials), bytes_per_trial(_trials_setup(group)))
    target = plan_run(config.replace(run_dir=None)).target_return
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    run_dir = config.run_dir or str(runs_root() / f"{stamp}-sweep-{config.algo}")
    return SweepPlan(config, seed_list, grid, points, trials, groups, target, run_dir)


def _trials_setup(group: ProgramGroup):
    from workbench.engine.plan import plan_run
    from workbench.learn.learner import AgentSpec
    from workbench.learn.trials import TrialsSetup

    config = group.trials[0].point.config
    run = plan_run(config.replace(run_dir=None))
    agent = AgentSpec(run.algorithm, run.hyperparameters, run.spaces, config.num_updates(1))
    values = tuple(tuple(float(getattr(t.point.config.hyperparameters(), f))
                         for f in group.traced_fields) for t in group.trials)
    return TrialsSetup(agent, run.jax_env.make, config.envs_per_chip, config.rollout_length,
                       group.traced_fields, values, tuple(t.seed for t in group.trials),
                       config.eval_episodes)


def _split_untraceable(group: ProgramGroup) -> list[ProgramGroup]:
    """A group whose fields the algorithm cannot take as values (it reads one in Python)
    splits into one program per grid point."""
    from workbench.learn.trials import traceable

    if not group.traced_fields or traceable(_trials_setup(group)):
        return [group]
    log.info("%s reads %s in Python: one program per grid point",
             group.trials[0].point.config.algo, ", ".join(group.traced_fields))
    by_point: dict[int, list[Trial]] = {}
    for trial in group.trials:
        by_point.setdefault(trial.point.index, []).append(trial)
    return [ProgramGroup(tuple(trials), ()) for trials in by_point.values()]


def check_memory(shape, trials: int, trial_bytes: int) -> None:
    """Refuse more trials than a chip's memory holds: ``trials`` split over the chips of a
    slice of ``shape``, ``trial_bytes`` each.

    Raises:
        ConfigError: naming the chips, the memory a chip would need, and the most trials
            that fit.
    """
    generation = shape.generation
    per_chip = -(-trials // shape.chips)
    limit = generation.hbm_gib_per_chip * 2**30
    if trial_bytes * per_chip > limit:
        raise ConfigError(
            "seeds",
            f"and the grid put {per_chip} trials on each of the {shape.chips} chips of a "
            f"{shape.label}, about {trial_bytes * per_chip / 2**30:.1f} GiB each, over the "
            f"{generation.hbm_gib_per_chip:g} GiB of a {generation.name} chip: sweep at most "
            f"{max(1, int(limit // trial_bytes)) * shape.chips} trials at a time, or fewer "
            "envs per chip.",
        )


class _SweepRun:
    def __init__(self, tpu_slice, plan: SweepPlan, on_update, should_stop,
                 distributed_timeout_s: float, poll_s: float) -> None:
        self.slice, self.plan = tpu_slice, plan
        self.on_update, self.should_stop = on_update, should_stop
        self.distributed_timeout_s, self.poll_s = distributed_timeout_s, poll_s
        self.curves = _Curves(plan.target_return)
        self.finals: dict[int, float] = {}
        self.started = time.monotonic()
        self.startup_s = 0.0
        self.wall_s = 0.0
        self.stopped = False
        self.restarts = 0
        self.trackers: dict[int, Any] = {}

    def run(self) -> SweepResult:
        from workbench.engine.checkpoint import make_private_dir

        make_private_dir(self.plan.run_dir)
        try:
            if self.plan.config.mode == "anakin":
                for group in self.plan.groups:
                    if self.stopped:
                        break
                    self._run_program_until_done(group)
            else:
                for trial in self.plan.trials:
                    if self.stopped:
                        break
                    self._run_queued(trial)
            return self._result()  # logs each trial's result to its tracker
        finally:
            for tracker in self.trackers.values():
                tracker.close()

    # ---- trackers --------------------------------------------------------------------

    def _tracker(self, trial: Trial):
        config = trial.point.config
        # Queued runs (actors mode) track themselves, as any run does.
        if config.track is None or config.mode != "anakin":
            return None
        if trial.index not in self.trackers:
            from workbench.engine.tracking import make_tracker

            folder = f"{self.plan.run_dir}/trial-{trial.index:04d}"
            tracker = make_tracker(config.track, folder, f"trial-{trial.index:04d}",
                                   config.tracking_uri)
            tracker.log_config({**dataclasses.asdict(trial.point.config.replace(
                algo_config=None, seed=trial.seed)), "algo_config":
                trial.point.config.hyperparameters()})
            self.trackers[trial.index] = tracker
        return self.trackers[trial.index]

    def _row(self, trial: Trial, row: dict) -> None:
        """Pass on one of ``trial``'s rows, as the curve records it."""
        tracker = self._tracker(trial)
        if tracker is not None:
            tracker.log_row(row)
        if self.on_update is not None:
            try:
                self.on_update(trial.index, row)
            except Exception:
                log.warning("a sweep callback failed", exc_info=True)

    def _wants_stop(self) -> bool:
        return self.should_stop is not None and bool(self.should_stop())

    # ---- Anakin: one program per group ----------------------------------------------------

    def _run_program_until_done(self, group: ProgramGroup) -> None:
        """Run ``group``'s program; after a chip failed or stopped answering, run it again
        from its start on fresh actors, up to the config's ``max_restarts`` times in the
        whole sweep. A program keeps no checkpoint, and its trials are short and seeded:
        run again, each trial's curve is the one it would have had."""
        limit = group.trials[0].point.config.max_restarts
        while True:
            try:
                self._run_program(group)
                return
            except SweepFailed as error:
                if self.restarts >= limit or self.stopped:
                    raise
                self.restarts += 1
                log.warning("%s Running its %d trials again from the start (restart %d of "
                            "at most %d).", error, len(group.trials), self.restarts, limit)
                for trial in group.trials:
                    self.curves.forget(trial.index)

    def _run_program(self, group: ProgramGroup) -> None:
        import ray

        setup = _trials_setup(group)
        config = group.trials[0].point.config
        tpu_slice = self.slice
        # The chips' TPU resource must be free for the programs' actors.
        stop_kept_learners(tpu_slice)
        actors = start_chip_actors(tpu_slice, TrialsActor, f"{tpu_slice.name}:sweep")
        # One thread: each chip's records are taken in the order it sent them.
        board = remote(SweepBoard, num_cpus=0, runtime_env=CPU_ONLY).options(
            scheduling_strategy=head_node_affinity()).remote()
        try:
            wait_for_joins(issue_joins(actors, tpu_slice.shape, self.distributed_timeout_s),
                           self.distributed_timeout_s, tpu_slice.shape.label)
            ray.get([a.setup.remote(setup) for a in actors], timeout=900)
            if not self.startup_s:
                self.startup_s = time.monotonic() - self.started
            # Trackers open before the loop: opening one (MLflow's import, its run) takes
            # seconds, which inside the loop would delay the first rows and any stop.
            for trial in group.trials:
                self._tracker(trial)
            steps = config.envs_per_chip * config.rollout_length
            loop_start = time.monotonic()
            runs = [a.run.remote(board, config.num_updates(1), steps) for a in actors]
            self._watch(group, board, runs, actors)
            outcomes = ray.get(runs)
            self.wall_s += time.monotonic() - loop_start
            self._drain(group, board)
            for outcome in outcomes:
                self.finals.update({group.trials[i].index: v
                                    for i, v in outcome.final.items()})
        finally:
            kill_and_wait(actors + [board])

    def _watch(self, group: ProgramGroup, board, runs: list, actors: list) -> None:
        """Until every chip's run has ended, passing records on and stops in. A chip whose
        run failed fails the sweep at once (the others may wait for it in a collective);
        chips that send no update for ``progress_timeout_s`` fail it too.

        Raises:
            SweepFailed: a chip's run failed (its actor died, or its program raised), or
                the chips still running sent no update for ``progress_timeout_s``.
        """
        import ray

        self._seen = 0
        timeout_s = group.trials[0].point.config.progress_timeout_s
        done: list = []
        seen_then, last_progress = 0, time.monotonic()
        while True:
            was_done = done
            done, _ = ray.wait(runs, num_returns=len(runs), timeout=self.poll_s)
            finished = [run for run in done if run not in was_done]
            _raise_if_failed(runs, finished)
            self._drain(group, board, actors)
            if self._seen != seen_then or finished:
                seen_then, last_progress = self._seen, time.monotonic()
            self._stop_chips_if_asked(actors)
            if len(done) == len(runs):
                return
            if timeout_s and time.monotonic() - last_progress > timeout_s:
                waiting = [rank for rank, run in enumerate(runs) if run not in done]
                raise SweepFailed(
                    f"The sweep's chips {waiting} sent no update for {timeout_s:g} s "
                    f"(progress_timeout_s): a chip's program stopped answering. Its actors "
                    "are stopped; run the sweep again, or raise progress_timeout_s for "
                    "updates that take longer."
                )

    def _drain(self, group: ProgramGroup, board, actors: list | None = None) -> None:
        """Pass the board's new records on as rows; with the chips' ``actors``, a stop
        asked for by a row's observer reaches them at once, not after the rest of the batch
        (which may be hundreds of rows, each tracked)."""
        import ray

        for record in ray.get(board.since.remote(self._seen), timeout=60):
            self._seen += 1
            trial = group.trials[record.trial]
            for row in self.curves.add(trial.index, record):
                self._row(trial, row.to_json())
            if actors is not None:
                self._stop_chips_if_asked(actors)

    def _stop_chips_if_asked(self, actors: list) -> None:
        import ray

        if not self.stopped and self._wants_stop():
            self.stopped = True
            ray.get([a.request_stop.remote() for a in actors], timeout=30)

    # ---- actors mode: queued runs --------------------------------------------------------

    def _run_queued(self, trial: Trial) -> None:
        from workbench.engine.driver import train

        config = trial.point.config.replace(
            seed=trial.seed, run_dir=f"{self.plan.run_dir}/trial-{trial.index:04d}")

        def on_row(row: dict) -> None:
            self._row(trial, row)

        result = train(self.slice, config, on_update=on_row, should_stop=self._wants_stop)
        if not self.startup_s:
            self.startup_s = result.startup_s
        self.wall_s += result.wall_s
        self.curves.runs[trial.index] = result
        self.finals[trial.index] = result.final_return
        if self._wants_stop():
            self.stopped = True

    # ---- the record ----------------------------------------------------------------------

    def _result(self) -> SweepResult:
        from workbench.engine.run_dir import write_json

        plan, tpu_slice = self.plan, self.slice
        trials = []
        for trial in plan.trials:
            curve = self.curves.of(trial.index)
            trials.append({
                "trial": trial.index,
                "config": trial.point.index,
                "seed": trial.seed,
                "overrides": dict(trial.point.overrides),
                "final_return": self.finals.get(trial.index),
                "time_to_train_target_s": curve.time_to_train_target_s,
                "env_steps_to_train_target": curve.env_steps_to_train_target,
                "mean_return_100": curve.mean_return_100,
                "updates": len(curve.rows),
                "curve": curve.rows,
            })
            tracker = self.trackers.get(trial.index)
            if tracker is not None:
                tracker.log_result({k: v for k, v in trials[-1].items() if k != "curve"})
        configs = []
        for point in plan.points:
            mine = [t for t in trials if t["config"] == point.index]
            configs.append({
                "config": point.index,
                "label": point.label(),
                "overrides": dict(point.overrides),
                "trials": len(mine),
                "reached_target": sum(t["time_to_train_target_s"] is not None for t in mine),
                "final_return": summarize([t["final_return"] for t in mine]),
                "time_to_train_target_s": summarize([t["time_to_train_target_s"]
                                                     for t in mine]),
            })
        env_steps = sum(t["curve"][-1]["env_steps"] for t in trials if t["curve"])
        result = SweepResult(
            generation=tpu_slice.shape.generation.name, topology=tpu_slice.shape.topology,
            chips=tpu_slice.num_chips, hosts=tpu_slice.num_hosts, mode=plan.config.mode,
            algo=plan.config.algo, env=plan.config.env, seeds=list(plan.seeds),
            grid=plan.grid, target_return=plan.target_return, trials=trials,
            configs=configs, programs=len(plan.groups) or len(plan.trials),
            startup_s=round(self.startup_s, 3), wall_s=round(self.wall_s, 3),
            env_steps=env_steps,
            env_steps_per_s=round(env_steps / self.wall_s, 1) if self.wall_s else 0.0,
            run_dir=plan.run_dir, stopped=self.stopped, restarts=self.restarts,
        )
        write_json(f"{plan.run_dir}/sweep.json", result.to_json())
        return result
