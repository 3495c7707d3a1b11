"""Aggregating per-chip update records into one training curve, and the two targets.

``MetricsLog`` is pure bookkeeping; the ``MetricsBoard`` actor holds one and runs the
greedy evaluations. A run without a target (an env with no ``reward_threshold``) records
its curve all the same and reaches no target.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

WINDOW = 100


@dataclass(frozen=True)
class UpdateRecord:
    """What one chip reports after one update."""

    update: int
    rank: int
    time: float
    env_steps: int
    """Env steps of the whole run so far, over all chips."""
    steps: int
    """Env steps this update added, over all chips."""
    episode_returns: list[float]
    step_s: float
    metrics: dict[str, float]
    policy_versions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class CurveRow:
    """One update of the run, joined over every chip: a point of the training curve.

    What the board sends the driver; a user sees it as :meth:`to_json` (the rows of
    ``TrainResult.curve`` and what ``on_update`` is called with).
    """

    update: int
    time: float
    """When the last chip finished the update (``time.time()``)."""
    env_steps: int
    """Env steps of the whole run so far, over all chips."""
    steps_this_update: int
    episodes: int
    """Episodes finished so far, over all chips."""
    episodes_this_update: int
    mean_return_this_update: float | None
    mean_return_100: float | None
    """Mean return of the last 100 episodes (None until that many finished)."""
    env_steps_per_s: float | None
    """This update's env steps over the seconds since the previous row (None for the
    first)."""
    chip_step_s: list[float]
    """Each chip's seconds for the update, by rank."""
    policy_versions: list[int]
    """The policy version of each batch rank 0 learned from."""
    metrics: dict[str, float]
    """The algorithm's own metrics of the update (losses...), as rank 0 had them."""

    def to_json(self) -> dict:
        """The row as the curve records it: the fields, then the algorithm's metrics,
        in one flat mapping."""
        return {
            "update": self.update,
            "time": self.time,
            "env_steps": self.env_steps,
            "steps_this_update": self.steps_this_update,
            "episodes": self.episodes,
            "episodes_this_update": self.episodes_this_update,
            "mean_return_this_update": self.mean_return_this_update,
            "mean_return_100": self.mean_return_100,
            "env_steps_per_s": self.env_steps_per_s,
            "chip_step_s": list(self.chip_step_s),
            "policy_versions": list(self.policy_versions),
            **self.metrics,
        }


@dataclass(frozen=True)
class Evaluation:
    """A greedy evaluation of the policy after an update."""

    update: int
    env_steps: int
    mean_return: float
    time: float
    """When it was scored (``time.time()``)."""

    def to_json(self) -> dict:
        return {"update": self.update, "env_steps": self.env_steps,
                "mean_return": self.mean_return, "time": self.time}


@dataclass(frozen=True)
class ReturnWindow:
    """The rolling window of returns as it was after an update: what a checkpoint of that
    update records (as :meth:`to_json`), and what a run resumed from it starts its curve
    from."""

    update: int
    recent: list[float] = field(default_factory=list)
    """The last returns, at most :data:`WINDOW` of them, oldest first."""
    episodes: int = 0
    """Episodes finished by then."""

    def to_json(self) -> dict:
        return {"update": self.update, "recent": list(self.recent), "episodes": self.episodes}

    @classmethod
    def from_json(cls, record: dict) -> ReturnWindow:
        """A window from a checkpoint's record of it (:meth:`to_json`)."""
        return cls(update=int(record.get("update") or 0),
                   recent=list(record.get("recent") or []),
                   episodes=int(record.get("episodes") or 0))


@dataclass(frozen=True)
class BoardSnapshot:
    """What the board has of the run for the driver: its rows after the one asked from,
    every evaluation, and the two targets."""

    rows: list[CurveRow]
    returns: list[list[float]]
    """The episode returns each of ``rows`` closed, row by row."""
    evals: list[Evaluation]
    """Every evaluation so far, in update order (not only the newer ones)."""
    train_target: CurveRow | None
    """The first row whose rolling mean reached the target."""
    eval_target: Evaluation | None
    """The first evaluation that reached the target."""


@dataclass(frozen=True)
class EvaluatorSpec:
    """What the board builds a run's greedy evaluator from (a
    :class:`~workbench.learn.evaluation.GreedyEvaluator`)."""

    env: Any
    """The env's id or reference, as the rollout actors make it."""
    agent: Any
    """The run's :class:`~workbench.learn.learner.AgentSpec`."""
    seed: int
    jax_env: Callable | None = None
    """Makes the env as a JAX env (Anakin), which evaluates on the device."""
    wrappers: tuple = ()


@dataclass(frozen=True)
class BoardRun:
    """What a :class:`MetricsBoard` needs of a run: its start, or :meth:`MetricsBoard.begin`
    for a kept board."""

    num_chips: int
    target_return: float | None
    eval_episodes: int
    evaluator: EvaluatorSpec
    log: MetricsLog | None = None
    """A log to continue (a replacement for a lost board); a new one when None."""


def rolling_mean(returns: list[float] | deque, window: int = WINDOW) -> float | None:
    """Mean of the last ``window`` returns, or None until that many episodes finished."""
    if len(returns) < window:
        return None
    return float(np.mean(list(returns)[-window:]))


class MetricsLog:
    """Joins every chip's record of an update into one row, in update order."""

    def __init__(self, num_chips: int, target_return: float | None) -> None:
        self.num_chips = num_chips
        self.target = target_return
        self.pending: dict[int, dict[int, UpdateRecord]] = {}
        self.curve: list[CurveRow] = []
        self.row_returns: list[list[float]] = []
        """The episode returns each row closed, kept apart so snapshots stay small."""
        self.last_closed = 0
        """The last update joined into a row (updates count from 1)."""
        self.recent: deque = deque(maxlen=WINDOW)
        self.episodes = 0
        self.target_row: CurveRow | None = None
        """The first row whose rolling mean reached the target."""
        self.evals: list[Evaluation] = []
        self.eval_target: Evaluation | None = None

    @property
    def rows(self) -> list[dict]:
        """The curve as a result records it, for callers in this process that return
        one (:mod:`workbench.engine.in_process`)."""
        return [row.to_json() for row in self.curve]

    @property
    def train_target(self) -> dict | None:
        """:attr:`target_row` as the curve records it."""
        return self.target_row.to_json() if self.target_row is not None else None

    def add(self, record: UpdateRecord) -> None:
        # NOTE: the board runs records on several threads, so one chip's records can arrive
        # out of order; rows are joined strictly in update order all the same. A record of
        # an update already joined (sent again to a replacement board) is dropped.
        if record.update <= self.last_closed:
            return
        self.pending.setdefault(record.update, {})[record.rank] = record
        while self.pending:
            next_update = self.last_closed + 1
            parts = self.pending.get(next_update, {})
            if len(parts) == self.num_chips:
                del self.pending[next_update]
                self._close(next_update, [parts[r] for r in sorted(parts)])
            else:
                # NOTE: never skipped: a record sent to a board that was lost reaches its
                # replacement too (the chips send their recent records again).
                return

    def _close(self, update: int, parts: list[UpdateRecord]) -> None:
        finished = [r for p in parts for r in p.episode_returns]  # rank order: reproducible
        self.recent.extend(finished)
        self.episodes += len(finished)
        now = max(p.time for p in parts)
        previous = self.curve[-1] if self.curve else None
        steps_this = parts[0].steps
        row = CurveRow(
            update=update,
            time=now,
            env_steps=parts[0].env_steps,
            steps_this_update=steps_this,
            episodes=self.episodes,
            episodes_this_update=len(finished),
            mean_return_this_update=float(np.mean(finished)) if finished else None,
            mean_return_100=rolling_mean(self.recent),
            env_steps_per_s=(
                steps_this / (now - previous.time) if previous and now > previous.time
                else None
            ),
            chip_step_s=[p.step_s for p in parts],
            policy_versions=list(parts[0].policy_versions),
            metrics=dict(parts[0].metrics),
        )
        self.curve.append(row)
        self.row_returns.append(finished)
        self.last_closed = update
        if (
            self.target_row is None
            and self.target is not None
            and row.mean_return_100 is not None
            and row.mean_return_100 >= self.target
        ):
            self.target_row = row

    def rewind(self, update: int) -> None:
        """Forget updates after ``update``: a restarted run redoes them from its last
        checkpoint, with the episode count and the rolling window as they were after
        ``update``: episodes the lost updates played came from a policy that is gone, and
        must not count towards the target.

        The checkpoint can be ahead of the last joined row (rank 0 saves update U after
        pushing its record; a chip that died before pushing U leaves U unjoined), so the
        next row expected is ``update + 1`` whatever the rows hold, and every record still
        waiting to be joined belongs to the dead attempt."""
        kept = sum(1 for r in self.curve if r.update <= update)
        self.curve, self.row_returns = self.curve[:kept], self.row_returns[:kept]
        self.recent = deque((r for returns in self.row_returns for r in returns),
                            maxlen=WINDOW)
        self.episodes = self.curve[-1].episodes if self.curve else 0
        self.pending = {}
        self.last_closed = update
        if self.target_row is not None and self.target_row.update > update:
            self.target_row = None
        # Likewise a greedy evaluation of a policy the checkpoint does not hold.
        self.evals = [e for e in self.evals if e.update <= update]
        if self.eval_target is not None and self.eval_target.update > update:
            self.eval_target = None

    def window_at(self, update: int) -> ReturnWindow | None:
        """The rolling window and episode count as they were after ``update`` (what a
        checkpoint of that update records), or None if its row is not closed yet."""
        kept = [i for i, r in enumerate(self.curve) if r.update <= update]
        if self.last_closed < update:
            return None
        returns = [x for i in kept for x in self.row_returns[i]][-WINDOW:]
        episodes = self.curve[kept[-1]].episodes if kept else 0
        return ReturnWindow(update=update, recent=returns, episodes=episodes)

    def seed(self, window: ReturnWindow) -> None:
        """Continue a run resumed from a checkpoint: rows from ``window.update + 1``, with
        its rolling window and episode count."""
        self.last_closed = window.update
        self.recent = deque(window.recent, maxlen=WINDOW)
        self.episodes = window.episodes
        self.pending = {}

    @classmethod
    def replay(cls, num_chips: int, target_return: float | None, rows: list[CurveRow],
               returns: list[list[float]], evals: list[Evaluation]) -> MetricsLog:
        """A log holding ``rows`` (what the driver has seen), to replace a lost board's."""
        log = cls(num_chips, target_return)
        log.curve, log.row_returns = list(rows), [list(r) for r in returns]
        log.last_closed = rows[-1].update if rows else 0
        log.recent = deque((x for r in log.row_returns for x in r), maxlen=WINDOW)
        log.episodes = rows[-1].episodes if rows else 0
        if target_return is not None:
            log.target_row = next((r for r in rows if r.mean_return_100 is not None
                                   and r.mean_return_100 >= target_return), None)
        for entry in evals:
            log.add_eval(entry.update, entry.env_steps, entry.mean_return, entry.time)
        return log

    def add_eval(self, update: int, env_steps: int, mean_return: float, time: float) -> None:
        entry = Evaluation(update=update, env_steps=env_steps, mean_return=mean_return,
                           time=time)
        self.evals.append(entry)
        if self.eval_target is None and self.target is not None and mean_return >= self.target:
            self.eval_target = entry

    def snapshot(self, since: int = 0) -> BoardSnapshot:
        newer = [i for i, r in enumerate(self.curve) if r.update > since]
        return BoardSnapshot(
            rows=[self.curve[i] for i in newer],
            returns=[self.row_returns[i] for i in newer],
            evals=list(self.evals),
            train_target=self.target_row,
            eval_target=self.eval_target,
        )


class MetricsBoard:
    """Collects per-update records from every chip and runs the greedy evaluations of the
    policies they send; the driver reads it without touching the learners. Run as a
    threaded Ray actor: a checkpointing chip may wait in :meth:`window` while records keep
    arriving.

    Evaluations run one at a time on a thread of their own, beside the records. The board
    builds each run's evaluator there as the run begins, so that the evaluator's start
    (JAX, the env, a compile) runs beside the first updates and not before them.

    NOTE: one process for both jobs, not an evaluator actor beside the board: each Ray
    process costs its own interpreter and Ray's worker (about 80 MiB), which a Binder
    session's 2 GiB feels.
    """

    def __init__(self, run: BoardRun) -> None:
        self._changed = threading.Condition()
        self._evaluations = ThreadPoolExecutor(max_workers=1, thread_name_prefix="evaluator")
        self.begin(run)

    def begin(self, run: BoardRun) -> None:
        """Serve a new run, forgetting the last one's (a slice that keeps its learners
        keeps its board too, see :mod:`workbench.engine.warm`)."""
        with self._changed:
            self.log = run.log or MetricsLog(run.num_chips, run.target_return)
            self.eval_episodes = run.eval_episodes
            self.pending: list[tuple[Future, int, int]] = []
            self._evaluator_built = self._evaluations.submit(self._build_evaluator,
                                                             run.evaluator)

    def _build_evaluator(self, spec: EvaluatorSpec):
        # JAX on the CPU (the head has no chip), as the rollout actors' runtime_env has
        # it; set here, before the board's first JAX import, rather than in a runtime_env
        # of its own, which would need a worker process started for it.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        from workbench.learn.evaluation import GreedyEvaluator
        from workbench.learn.platform import use_compile_cache

        # A JAX env's evaluation program compiles for seconds beside the starting
        # learners: kept for the next run of the same policy and env instead.
        use_compile_cache()
        evaluator = GreedyEvaluator(spec.env, spec.agent, spec.seed, jax_env=spec.jax_env,
                                    wrappers=spec.wrappers)
        evaluator.prepare(self.eval_episodes)
        return evaluator

    def _greedy_returns(self, built: Future, policy, episodes: int) -> list[float]:
        # ``built`` is the evaluator of the run that asked, bound when it asked: the next
        # run's evaluator is built after this on the one thread.
        return built.result().evaluate(policy, episodes)

    def record(self, record: UpdateRecord) -> None:
        with self._changed:
            self.log.add(record)
            self._changed.notify_all()

    def window(self, update: int, wait_s: float = 10.0) -> ReturnWindow | None:
        """The rolling window after ``update`` (for its checkpoint), waiting a little for
        the other chips' records of it."""
        with self._changed:
            self._changed.wait_for(lambda: self.log.window_at(update) is not None, wait_s)
            return self.log.window_at(update)

    def seed(self, window: ReturnWindow) -> None:
        with self._changed:
            self.log.seed(window)

    def evaluate(self, policy, update: int, env_steps: int) -> None:
        """Queue a greedy evaluation of ``policy``, the policy after ``update``."""
        with self._changed:
            self._collect()
            future = self._evaluations.submit(self._greedy_returns, self._evaluator_built,
                                              policy, self.eval_episodes)
            self.pending.append((future, update, env_steps))

    def final_returns(self, policy, episodes: int) -> list[float]:
        """The greedy episodes of the run's final policy, after the evaluations queued."""
        return self._evaluations.submit(self._greedy_returns, self._evaluator_built, policy,
                                        episodes).result()

    def _collect(self, wait: bool = False) -> None:
        if self._evaluator_built.done() and self._evaluator_built.exception() is not None:
            # The evaluator cannot be built (its env, its agent): the run's error to report.
            raise self._evaluator_built.exception()
        still = []
        for future, update, env_steps in self.pending:
            if not (wait or future.done()):
                still.append((future, update, env_steps))
                continue
            returns = future.result()
            self.log.add_eval(update, env_steps, float(np.mean(returns)), time.time())
        self.pending = still

    def rewind(self, update: int) -> None:
        with self._changed:
            # An evaluation of a policy the checkpoint does not hold runs to its end unread.
            self.pending = [entry for entry in self.pending if entry[1] <= update]
            self.log.rewind(update)

    def snapshot(self, since: int = 0, wait_evals: bool = False) -> BoardSnapshot:
        with self._changed:
            self._collect(wait_evals)
            return self.log.snapshot(since)
