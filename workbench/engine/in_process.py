"""A run in this one process, without Ray: the same learner, rollouts and update as a run
on a slice, on this process's devices.

What a one-chip slice runs, minus the processes: in actors mode a rollout worker here feeds
the learner (same gymnasium vector envs, same policy forward, same update, same policy
lag), in Anakin mode the learner steps its own JAX envs. It is the peer the benchmarks
hold the slice against, and how the tests check that an algorithm learns without paying
for a cluster.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from workbench.engine.config import TrainConfig
from workbench.engine.metrics import MetricsLog, UpdateRecord


@dataclass
class InProcessResult:
    """What an in-process run did."""

    curve: list[dict]
    """One row per update, as a slice run's (``mean_return_100``, losses...)."""
    env_steps: int
    loop_s: float
    """Seconds of the training loop."""
    startup_s: float
    """Seconds to build the learner and compile its update."""
    final_return: float | None
    """Mean return of the greedy evaluation at the end (None without ``evaluate``)."""
    train_target: dict | None
    """The row where the last 100 episodes first averaged the target."""
    policy_versions: list[list[int]] = dataclasses.field(default_factory=list)
    """The policy version of each batch each update learned from."""
    loop_started: float = 0.0
    """When the training loop started (``time.time()``), what row times count from."""

    @property
    def time_to_train_target_s(self) -> float | None:
        """Seconds of training loop until the training target, if it was reached."""
        if self.train_target is None:
            return None
        return self.train_target["time"] - self.loop_started

    @property
    def env_steps_per_s(self) -> float:
        return self.env_steps / self.loop_s if self.loop_s > 0 else 0.0


def train_in_process(config: TrainConfig, *, chips: int = 1, evaluate: bool = True
                     ) -> InProcessResult:
    """Train ``config`` here, as a slice of ``chips`` chips would, on one device.

    Args:
        config: the run; ``stop_at_target`` ends it at the training target.
        chips: whose global batch to learn from: ``envs_per_chip x chips`` envs on the one
            device, so that a peer of a 4-chip slice learns from the same batches.
        evaluate: run the final greedy evaluation.

    Raises:
        ValueError: a config that cannot work.
    """
    from workbench.engine.plan import plan_run
    from workbench.learn.actors_mode import LocalSource
    from workbench.learn.evaluation import GreedyEvaluator
    from workbench.learn.modes import learner_class
    from workbench.learn.rollout import RolloutWorker

    config = config.replace(envs_per_chip=config.envs_per_chip * chips)
    plan = plan_run(config.replace(run_dir=None, checkpoint_dir=None))
    started = time.monotonic()
    setup = plan.learner_setup(1, "batch")
    source = None
    if plan.host_rollouts:
        worker = RolloutWorker(plan.env_ref, config.envs_per_chip, config.rollout_length,
                               setup.agent, config.seed, wrappers=config.wrappers)
        worker.prepare()
        source = LocalSource([worker])
    learner = learner_class(config.mode)(setup, source)
    learner.compile()
    startup_s = time.monotonic() - started
    log = MetricsLog(1, plan.target_return)
    env_steps = 0
    versions = []
    loop_start = time.time()
    for update in range(setup.agent.num_updates):
        outcome = learner.step()
        env_steps += outcome.env_steps
        versions.append(list(outcome.policy_versions))
        log.add(UpdateRecord(update + 1, 0, time.time(), env_steps, outcome.env_steps,
                             list(outcome.episode_returns), outcome.step_s, outcome.metrics))
        if config.stop_at_target and log.train_target is not None:
            break
    learner.finish()
    loop_s = time.time() - loop_start
    final = None
    if evaluate:
        jax_env = plan.jax_env.make if plan.jax_env is not None else None
        evaluator = GreedyEvaluator(plan.env_ref or config.env, setup.agent, config.seed,
                                    jax_env, config.wrappers)
        returns = evaluator.evaluate(learner.policy_numpy(), config.eval_episodes)
        final = sum(returns) / len(returns)
    return InProcessResult(log.rows, env_steps, loop_s, startup_s, final, log.train_target,
                           versions, loop_start)
