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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

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
        self.rows: list[dict] = []
        self.row_returns: list[list[float]] = []
        """The episode returns each row closed, kept apart so snapshots stay small."""
        self.last_closed = 0
        """The last update joined into a row (updates count from 1)."""
        self.recent: deque = deque(maxlen=WINDOW)
        self.episodes = 0
        self.train_target: dict | None = None
        self.evals: list[dict] = []
        self.eval_target: dict | None = None

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
        previous = self.rows[-1] if self.rows else None
        steps = parts[0].env_steps
        steps_this = parts[0].steps
        row = {
            "update": update,
            "time": now,
            "env_steps": steps,
            "steps_this_update": steps_this,
            "episodes": self.episodes,
            "episodes_this_update": len(finished),
            "mean_return_this_update": float(np.mean(finished)) if finished else None,
            "mean_return_100": rolling_mean(self.recent),
            "env_steps_per_s": (
                steps_this / (now - previous["time"]) if previous and now > previous["time"]
                else None
            ),
            "chip_step_s": [p.step_s for p in parts],
            "policy_versions": list(parts[0].policy_versions),
            **parts[0].metrics,
        }
        self.rows.append(row)
        self.row_returns.append(finished)
        self.last_closed = update
        if (
            self.train_target is None
            and self.target is not None
            and row["mean_return_100"] is not None
            and row["mean_return_100"] >= self.target
        ):
            self.train_target = row

    def rewind(self, update: int) -> None:
        """Forget updates after ``update``: a restarted run redoes them from its last
        checkpoint, with the episode count and the rolling window as they were after
        ``update``: episodes the lost updates played came from a policy that is gone, and
        must not count towards the target.

        The checkpoint can be ahead of the last joined row (rank 0 saves update U after
        pushing its record; a chip that died before pushing U leaves U unjoined), so the
        next row expected is ``update + 1`` whatever the rows hold, and every record still
        waiting to be joined belongs to the dead attempt."""
        kept = sum(1 for r in self.rows if r["update"] <= update)
        self.rows, self.row_returns = self.rows[:kept], self.row_returns[:kept]
        self.recent = deque((r for returns in self.row_returns for r in returns),
                            maxlen=WINDOW)
        self.episodes = self.rows[-1]["episodes"] if self.rows else 0
        self.pending = {}
        self.last_closed = update
        if self.train_target is not None and self.train_target["update"] > update:
            self.train_target = None
        # Likewise a greedy evaluation of a policy the checkpoint does not hold.
        self.evals = [e for e in self.evals if e["update"] <= update]
        if self.eval_target is not None and self.eval_target["update"] > update:
            self.eval_target = None

    def window_at(self, update: int) -> dict | None:
        """The rolling window and episode count as they were after ``update`` (what a
        checkpoint of that update records), or None if its row is not closed yet."""
        kept = [i for i, r in enumerate(self.rows) if r["update"] <= update]
        if self.last_closed < update:
            return None
        returns = [x for i in kept for x in self.row_returns[i]][-WINDOW:]
        episodes = self.rows[kept[-1]]["episodes"] if kept else 0
        return {"update": update, "recent": returns, "episodes": episodes}

    def seed(self, window: dict) -> None:
        """Continue a run resumed from a checkpoint: rows from ``window["update"] + 1``,
        with its rolling window and episode count."""
        self.last_closed = int(window["update"])
        self.recent = deque(window.get("recent") or [], maxlen=WINDOW)
        self.episodes = int(window.get("episodes") or 0)
        self.pending = {}

    @classmethod
    def replay(cls, num_chips: int, target_return: float | None, rows: list[dict],
               returns: list[list[float]], evals: list[dict]) -> MetricsLog:
        """A log holding ``rows`` (what the driver has seen), to replace a lost board's."""
        log = cls(num_chips, target_return)
        log.rows, log.row_returns = list(rows), [list(r) for r in returns]
        log.last_closed = rows[-1]["update"] if rows else 0
        log.recent = deque((x for r in log.row_returns for x in r), maxlen=WINDOW)
        log.episodes = rows[-1]["episodes"] if rows else 0
        if target_return is not None:
            log.train_target = next((r for r in rows if r["mean_return_100"] is not None
                                     and r["mean_return_100"] >= target_return), None)
        for entry in evals:
            log.add_eval(entry["update"], entry["env_steps"], entry["mean_return"],
                         entry["time"])
        return log

    def add_eval(self, update: int, env_steps: int, mean_return: float, time: float) -> None:
        entry = {"update": update, "env_steps": env_steps, "mean_return": mean_return,
                 "time": time}
        self.evals.append(entry)
        if self.eval_target is None and self.target is not None and mean_return >= self.target:
            self.eval_target = entry

    def snapshot(self, since: int = 0) -> dict:
        newer = [i for i, r in enumerate(self.rows) if r["update"] > since]
        return {
            "updates": [self.rows[i] for i in newer],
            "returns": [self.row_returns[i] for i in newer],
            "evals": list(self.evals),
            "train_target_update": self.train_target["update"] if self.train_target else None,
            "train_target_time": self.train_target["time"] if self.train_target else None,
            "train_target_env_steps": (
                self.train_target["env_steps"] if self.train_target else None
            ),
            "eval_target_time": self.eval_target["time"] if self.eval_target else None,
        }


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

    def __init__(self, num_chips: int, target_return: float | None, eval_episodes: int,
                 evaluator_args: tuple, log: MetricsLog | None = None) -> None:
        self._changed = threading.Condition()
        self._evaluations = ThreadPoolExecutor(max_workers=1, thread_name_prefix="evaluator")
        self.begin(num_chips, target_return, eval_episodes, evaluator_args, log)

    def begin(self, num_chips: int, target_return: float | None, eval_episodes: int,
              evaluator_args: tuple, log: MetricsLog | None = None) -> None:
        """Serve a new run, forgetting the last one's (a slice that keeps its learners
        keeps its board too, see :mod:`workbench.engine.warm`)."""
        with self._changed:
            self.log = log or MetricsLog(num_chips, target_return)
            self.eval_episodes = eval_episodes
            self.pending: list[tuple[Future, int, int]] = []
            self._evaluator_built = self._evaluations.submit(self._build_evaluator,
                                                             evaluator_args)

    def _build_evaluator(self, evaluator_args: tuple):
        # JAX on the CPU (the head has no chip), as the rollout actors' runtime_env has
        # it; set here, before the board's first JAX import, rather than in a runtime_env
        # of its own, which would need a worker process started for it.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        from workbench.learn.evaluation import GreedyEvaluator
        from workbench.learn.platform import use_compile_cache

        # A JAX env's evaluation program compiles for seconds beside the starting
        # learners: kept for the next run of the same policy and env instead.
        use_compile_cache()
        evaluator = GreedyEvaluator(*evaluator_args)
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

    def window(self, update: int, wait_s: float = 10.0) -> dict | None:
        """The rolling window after ``update`` (for its checkpoint), waiting a little for
        the other chips' records of it."""
        with self._changed:
            self._changed.wait_for(lambda: self.log.window_at(update) is not None, wait_s)
            return self.log.window_at(update)

    def seed(self, window: dict) -> None:
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

    def snapshot(self, since: int = 0, wait_evals: bool = False) -> dict:
        with self._changed:
            self._collect(wait_evals)
            return self.log.snapshot(since)
