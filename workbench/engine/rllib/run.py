"""A run of an RLlib algorithm on a reserved slice: build it inside the slice, call
``train()`` until the budget, the target or a stop, checkpoint with RLlib's own
``save_to_path``, and leave the same result record as the JAX engine (``engine="rllib"``).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.engine.background import BackgroundRun
from workbench.engine.restarts import ChipLost, hold_intact_slice
from workbench.engine.result import TrainResult

log = logging.getLogger(__name__)

EXTRA = "pip install 'tpu-rl-workbench[rllib]'"
CHECKPOINT_PREFIX = "iteration-"


def is_rllib_config(config: Any) -> bool:
    """Whether ``config`` is an RLlib ``AlgorithmConfig`` (checked without importing RLlib)."""
    return any(c.__name__ == "AlgorithmConfig" and c.__module__.startswith("ray.rllib")
               for c in type(config).__mro__)


def require_torch() -> None:
    """Raise a clear ``ImportError`` naming the extra when torch, which RLlib's learners
    need, is not installed."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ImportError(f"The RLlib engine needs torch for RLlib's learners: {EXTRA}") \
            from None


@dataclass(frozen=True)
class RLlibOptions:
    """How an RLlib run is driven; the algorithm itself is the user's ``AlgorithmConfig``."""

    total_env_steps: int = 200_000
    target_return: float | None = None
    """Stop once RLlib's ``episode_return_mean`` reaches this (None: train to the budget)."""
    checkpoint_every: int = 10
    """Iterations (``train()`` calls) between checkpoints; one is also written at the end."""
    run_dir: str | None = None
    """The run's folder; a new one under ``./runs`` (or ``$WORKBENCH_RUNS``) by default. A
    folder that holds a checkpoint is resumed from its latest one."""
    max_restarts: int = 2
    """Times a lost learner (killed, or its host lost) restarts the algorithm on an intact
    slice from the last checkpoint before the run fails."""
    recover_timeout_s: float = 300.0
    """How long a restart waits for an intact slice of the same shape."""

    def __post_init__(self) -> None:
        from workbench.engine.fields import check_finite, check_seconds, check_whole

        for name in ("total_env_steps", "checkpoint_every"):
            check_whole(name, getattr(self, name), 1)
        check_whole("max_restarts", self.max_restarts, 0)
        check_seconds("recover_timeout_s", self.recover_timeout_s, zero_allowed=False)
        if self.target_return is not None:
            check_finite("target_return", self.target_return)


def _run_dir(config, options: RLlibOptions) -> Path:
    from workbench.engine.checkpoint import make_private_dir
    from workbench.engine.plan import runs_root

    if options.run_dir:
        return make_private_dir(Path(options.run_dir).absolute())
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    env = re.sub(r"[^A-Za-z0-9]+", "-", str(config.env)).strip("-")
    name = f"{stamp}-{env}-rllib-{algo_name(config)}-{uuid.uuid4().hex[:6]}"
    return make_private_dir(runs_root() / name)


def algo_name(config) -> str:
    return config.algo_class.__name__ if config.algo_class else type(config).__name__


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """The newest ``iteration-N`` checkpoint in ``run_dir``, as (N, folder)."""
    found = []
    for path in (run_dir / "checkpoints").glob(f"{CHECKPOINT_PREFIX}*"):
        number = path.name[len(CHECKPOINT_PREFIX):]
        if number.isdigit() and (path / "algorithm_state.pkl").exists():
            found.append((int(number), path))
    return max(found) if found else None


def _save(algorithm, run_dir: Path, iteration: int) -> str:
    from workbench.engine.checkpoint import make_private_dir

    folder = make_private_dir(run_dir / "checkpoints") / f"{CHECKPOINT_PREFIX}{iteration}"
    algorithm.save_to_path(str(folder))
    return str(folder)


def _lost_learners(algorithm) -> int:
    """How many of the algorithm's remote learners are dead (RLlib's learners have no
    fault tolerance of their own: a dead one fails every later update)."""
    import ray

    group = algorithm.learner_group
    if group is None or group.is_local:
        return 0
    # Survivors may still be failing out of a collective with the dead one; they are not
    # waited for: a dead actor answers with its error at once.
    answers = group.foreach_learner(lambda learner: None, healthy_only=False,
                                    timeout_seconds=10)
    return sum(not answer.ok and isinstance(answer.get(), ray.exceptions.RayActorError)
               for answer in answers)


def _host_platform(tpu_slice) -> str:
    """What chip 0's host runs on, asked on that host (its processes decide the device)."""
    import ray

    from workbench.learn.platform import current_platform

    probe = ray.remote(num_cpus=0)(current_platform).options(
        scheduling_strategy=tpu_slice.scheduling(0))
    return ray.get(probe.remote(), timeout=120)


def _learner_digests(algorithm) -> list[str]:
    def digest(learner) -> str:
        import pickle

        state = learner.get_state(components="rl_module")
        return hashlib.sha256(pickle.dumps(state)).hexdigest()

    return [r.get() for r in algorithm.learner_group.foreach_learner(digest)]


def _row(result: dict, iteration: int, loop_s: float, steps_before: int,
         first_steps: int) -> dict:
    """One iteration as the dashboards' rows; ``first_steps``: the steps a resumed run's
    checkpoint had already made (not this run's throughput)."""
    from ray.rllib.utils.metrics import (
        ENV_RUNNER_RESULTS,
        EPISODE_RETURN_MEAN,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
    )

    runners = result.get(ENV_RUNNER_RESULTS, {})
    steps = int(runners.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, steps_before))
    mean = runners.get(EPISODE_RETURN_MEAN)
    mean = None if mean is None or mean != mean else float(mean)  # NaN: no episode ended
    return {"update": iteration, "env_steps": steps, "steps_this_update": steps - steps_before,
            "wall_s": round(loop_s, 3),
            "env_steps_per_s": (steps - first_steps) / loop_s if loop_s else None,
            "mean_return_100": mean, "mean_return_this_update": mean, "chip_step_s": []}


@dataclass(frozen=True)
class RLlibPlan:
    """An RLlib run checked against its slice, before anything is started."""

    config: Any
    options: RLlibOptions
    run_dir: Path
    resume: tuple[int, Path] | None
    """The checkpoint the run continues from: (iteration, folder)."""


def plan_rllib(tpu_slice, config, options: RLlibOptions | None = None) -> RLlibPlan:
    """Check an RLlib run against ``tpu_slice`` and give it its folder; starts nothing.

    Raises:
        ImportError: torch is not installed (names the extra).
        ValueError: a config that is not RLlib's new API stack with torch, or whose
            learners or env runners do not fit the slice.
        CheckpointError: the run folder's checkpoint could be written by others.
    """
    from workbench.engine.checkpoint import check_private
    from workbench.engine.rllib.placement import check_fits, learner_count

    require_torch()
    options = options or RLlibOptions()
    if not is_rllib_config(config):
        raise ValueError(f"Expected an RLlib AlgorithmConfig (e.g. PPOConfig()...), got "
                         f"{type(config).__name__}.")
    if not config.enable_rl_module_and_learner or config.framework_str != "torch":
        raise ValueError("The RLlib engine runs RLlib's new API stack with torch learners; "
                         "this config uses the old stack or another framework.")
    if tpu_slice.released:
        raise ValueError("This slice has been released; reserve one again first.")
    check_fits(config, tpu_slice.num_chips, tpu_slice.cpus_per_chip,
               learner_count(config, tpu_slice.num_chips))
    run_dir = _run_dir(config, options)
    resume = latest_checkpoint(run_dir)
    if resume is not None:
        check_private(resume[1])  # RLlib's checkpoints are unpickled
    return RLlibPlan(config, options, run_dir, resume)


def train_rllib(tpu_slice, config, options: RLlibOptions | None = None, *,
                on_update: Callable[[dict], None] | None = None,
                should_stop: Callable[[], bool] | None = None) -> TrainResult:
    """Train an RLlib ``AlgorithmConfig`` on every chip of a reserved slice, blocking.

    Its learners take one chip each (``{"TPU": 1}`` in the chip's bundle) and form RLlib's
    data-parallel group; its env runners use the hosts' CPUs of the same bundles. The
    algorithm is checkpointed with RLlib's ``save_to_path`` every
    ``options.checkpoint_every`` iterations and at the end (also when stopped, or when
    the process gets SIGTERM); a run folder that holds a checkpoint is resumed from it.
    For a run in the background, use :class:`RLlibRun`.

    Raises:
        ImportError: torch is not installed (names the extra).
        ValueError: a config that is not RLlib's new API stack with torch, or whose
            learners or env runners do not fit the slice (nothing is started).
    """
    from workbench.engine.stops import handle_termination

    plan = plan_rllib(tpu_slice, config, options)
    handle_termination()
    return run_planned_rllib(tpu_slice, plan, on_update, should_stop)


def run_planned_rllib(tpu_slice, plan: RLlibPlan,
                      on_update: Callable[[dict], None] | None = None,
                      should_stop: Callable[[], bool] | None = None) -> TrainResult:
    """Build the planned algorithm inside the slice and train it (see :func:`train_rllib`).
    A lost learner restarts it on an intact slice from the last checkpoint, up to
    ``plan.options.max_restarts`` times.

    Raises:
        ChipLost: a learner was lost once more than ``max_restarts`` allows.
        SliceUnavailableError: no intact slice came back for a restart in time.
    """
    from workbench.engine.rllib.backend import learner_backend
    from workbench.engine.stops import registered
    from workbench.engine.warm import stop_kept_learners

    started = time.monotonic()
    backend = learner_backend(_host_platform(tpu_slice))
    # Learners an earlier JAX run kept warm hold the chips RLlib's learners need.
    stop_kept_learners(tpu_slice)
    # SIGTERM (a pod evicted) stops the loop after its current iteration, which then
    # checkpoints like any stop; the process waits for the algorithm to be shut down too.
    terminated = threading.Event()
    training = _Training(tpu_slice, plan, backend, started, on_update,
                         lambda: terminated.is_set() or bool(should_stop and should_stop()))
    with registered(terminated):
        resume = plan.resume
        while True:
            try:
                return training.attempt(resume)
            except ChipLost as lost:
                training.recover(lost)
                resume = latest_checkpoint(plan.run_dir)


class RLlibRun(BackgroundRun):
    """An RLlib run on a reserved slice, going on in a background thread, with the same
    callbacks, Stop and interrupt handling as :class:`~workbench.engine.run.TrainingRun`.

    Raises:
        ImportError, ValueError: as :func:`plan_rllib` (nothing is started).
    """

    def __init__(self, tpu_slice, config, options: RLlibOptions | None = None, *,
                 release_slice: bool = False) -> None:
        super().__init__(tpu_slice, release_slice=release_slice)
        self.config = config
        # Fail in the calling cell, not later in the thread.
        self.plan = plan_rllib(tpu_slice, config, options)
        self.result: TrainResult | None = None

    @property
    def run_dir(self) -> str:
        return str(self.plan.run_dir)

    @property
    def target_return(self) -> float | None:
        return self.plan.options.target_return

    def _work(self) -> TrainResult:
        return run_planned_rllib(self.tpu_slice, self.plan, self._on_row, self._stop.is_set)


class _Training:
    """One RLlib run across its attempts: the curve so far, and what restarts cost."""

    def __init__(self, tpu_slice, plan: RLlibPlan, backend, started: float, on_update,
                 should_stop) -> None:
        self.slice, self.plan, self.backend = tpu_slice, plan, backend
        self.started, self.on_update, self.should_stop = started, on_update, should_stop
        self.rows: list[dict] = []
        self.loop_s = 0.0
        self.startup_s: float | None = None
        self.first_steps: int | None = None
        self.restarts = 0
        self.recovery_s = 0.0
        self.env_steps_redone = 0

    def attempt(self, resume: tuple[int, Path] | None) -> TrainResult:
        """Build the algorithm on the slice, restore ``resume`` and train to the end."""
        from workbench.engine.rllib.placement import bind, building_on, placed_config

        placed, placement = placed_config(self.plan.config, self.slice, self.backend)
        with building_on(placement):
            algorithm = placed.build_algo()
        bind(algorithm, placement)
        try:
            iteration = 0
            if resume is not None:
                with building_on(placement):
                    algorithm.restore_from_path(str(resume[1]))
                iteration = resume[0]
            self._rewind(iteration)
            return self._loop(algorithm, placement, iteration)
        finally:
            try:
                algorithm.stop()
            except Exception:  # after a lost learner; the slice's release removes the rest
                log.warning("stopping the RLlib algorithm failed", exc_info=True)

    def _rewind(self, iteration: int) -> None:
        """Drop the rows after the checkpoint a restart continues from."""
        kept = [row for row in self.rows if row["update"] <= iteration]
        if len(kept) < len(self.rows):
            steps_then = kept[-1]["env_steps"] if kept else self.first_steps
            self.env_steps_redone += self.rows[-1]["env_steps"] - steps_then
        self.rows = kept

    def recover(self, lost: ChipLost) -> None:
        """Hold an intact slice of the same shape in place of this one, for a restart.

        Raises:
            ChipLost: past ``max_restarts``.
        """
        options = self.plan.options
        self.recovery_s += hold_intact_slice(self.slice, lost, self.restarts,
                                             options.max_restarts, options.recover_timeout_s)
        self.restarts += 1

    @staticmethod
    def _guarded(algorithm, action: Callable[[], Any]) -> Any:
        """``action()``; a failure that comes from a dead learner raises ChipLost."""
        try:
            return action()
        except Exception as error:
            lost = _lost_learners(algorithm)
            if lost:
                raise ChipLost(f"{lost} RLlib learner(s) lost "
                                  f"({type(error).__name__})") from error
            raise

    def _train_once(self, algorithm, placement) -> dict:
        from workbench.engine.rllib.placement import building_on

        def train() -> dict:
            with building_on(placement):  # env runners RLlib replaces stay on the slice
                return algorithm.train()

        return self._guarded(algorithm, train)

    def _save(self, algorithm, iteration: int) -> str:
        return self._guarded(algorithm, lambda: _save(algorithm, self.plan.run_dir, iteration))

    def _loop(self, algorithm, placement, iteration: int) -> TrainResult:
        from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME

        config, options, run_dir = self.plan.config, self.plan.options, self.plan.run_dir
        first_iteration = self.plan.resume[0] if self.plan.resume else 0
        if self.startup_s is None:
            self.startup_s = time.monotonic() - self.started
        # A resumed algorithm's counters go on from its checkpoint.
        steps = int(algorithm.metrics.peek(
            (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0))
        if self.first_steps is None:
            self.first_steps = steps
        hit_s = hit_steps = None
        checkpoint = None
        started_at = iteration
        try:
            while steps < options.total_env_steps and not self.should_stop():
                tick = time.monotonic()
                result = self._train_once(algorithm, placement)
                self.loop_s += time.monotonic() - tick
                iteration += 1
                row = _row(result, iteration, self.loop_s, steps, self.first_steps)
                steps = row["env_steps"]
                self.rows.append(row)
                if self.on_update is not None:
                    self.on_update(row)
                mean = row["mean_return_100"]
                if options.target_return is not None and mean is not None and \
                        mean >= options.target_return:
                    hit_s, hit_steps = self.loop_s, steps
                    break
                if iteration % options.checkpoint_every == 0:
                    checkpoint = self._save(algorithm, iteration)
        except KeyboardInterrupt:
            # Ctrl-C in a cell that trains in the foreground: keep what was learned.
            if iteration > started_at:
                _save(algorithm, run_dir, iteration)
            raise
        if iteration > started_at:
            checkpoint = self._save(algorithm, iteration)
        last = next((r["mean_return_100"] for r in reversed(self.rows)
                     if r["mean_return_100"] is not None), float("nan"))
        shape = self.slice.shape
        return TrainResult(
            env_steps=steps, wall_s=self.loop_s, final_return=last,
            env_steps_per_s=(steps - self.first_steps) / self.loop_s if self.loop_s else 0.0,
            time_to_eval_target_s=None,
            time_to_train_target_s=hit_s, env_steps_to_train_target=hit_steps,
            startup_s=self.startup_s, generation=shape.generation.name,
            topology=shape.topology, chips=self.slice.num_chips, hosts=self.slice.num_hosts,
            engine="rllib", mode="actors", algo=algo_name(config), env=str(config.env),
            sync="gradients", seed=int(config.seed or 0), updates=iteration,
            checkpoint=checkpoint, run_dir=str(run_dir), target_return=options.target_return,
            resumed_from_update=first_iteration or None, restarts=self.restarts,
            recovery_s=round(self.recovery_s, 3), env_steps_redone=self.env_steps_redone,
            chip_state_digests=self._guarded(algorithm, lambda: _learner_digests(algorithm)),
            curve=self.rows)
