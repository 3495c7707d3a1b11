"""The actors a run places on the slice: one learner per chip, and the evaluator.

Each is a plain class that Ray runs as an actor pinned to a bundle; the learning itself is
the learn layer's (:mod:`workbench.learn`), which knows nothing of Ray.
"""

from __future__ import annotations

import logging
import time

from workbench.engine.config import TrainConfig
from workbench.engine.metrics import UpdateRecord
from workbench.learn.heap import release_freed_memory
from workbench.learn.learner import LearnerSetup

log = logging.getLogger(__name__)


class ChipLearnerActor:
    """One chip's learner process (a Ray actor pinned to the chip's bundle)."""

    def __init__(self, rank: int, num_chips: int) -> None:
        self.rank = rank
        self.num_chips = num_chips
        self._stop_requested = False

    def coordinator_address(self) -> str:
        import ray

        from workbench.tpu.ports import free_port

        host = ray.util.get_node_ip_address()
        return f"{host}:{free_port(host)}"

    def platform(self) -> str:
        """The JAX platform of this host (``cpu`` on the simulated slice)."""
        from workbench.learn.platform import current_platform

        return current_platform()

    def join(self, coordinator: str, timeout_s: float) -> float:
        from workbench.learn.platform import (
            configure_jax_platform,
            current_platform,
            join_distributed,
        )

        configure_jax_platform(current_platform())
        return join_distributed(coordinator, self.num_chips, self.rank, timeout_s)

    def setup(self, config: TrainConfig, setup: LearnerSetup, mode: str, feed: tuple | None,
              board) -> dict:
        """Build this chip's learner (and resume it from the checkpoint when asked)."""
        import jax

        from workbench.engine.checkpoint import restore, unpack
        from workbench.engine.rollouts import RolloutFeed
        from workbench.learn.modes import learner_class

        self.config = config
        self.board = board
        self.num_updates = setup.agent.num_updates
        self.feed = RolloutFeed(*feed, rank=self.rank) if feed is not None else None
        self.learner = learner_class(mode)(setup, self.feed)
        self.start_update = 0
        self.env_steps = 0
        if config.resume:
            saved = restore(config.checkpoint_dir)
            self.learner.load_state_leaves(unpack(saved), int(saved["update"]))
            self.start_update = int(saved["update"])
            self.env_steps = int(saved["env_steps"])
        return {"devices": jax.device_count(), "start_update": self.start_update,
                "env_steps": self.env_steps}

    def compile(self) -> float:
        """Compile the update before the loop starts, so the loop starts hot."""
        seconds = self.learner.compile()
        release_freed_memory()
        return seconds

    def request_stop(self) -> None:
        self._stop_requested = True

    def train(self) -> dict:
        import ray

        from workbench.engine.checkpoint import pack, save

        config, learner = self.config, self.learner
        last_saved = None
        loop_start = time.time()
        for update in range(self.start_update, self.num_updates):
            outcome = learner.step(stop=self._stop_requested)
            self.env_steps += outcome.env_steps
            self.board.record.remote(UpdateRecord(
                update=update + 1,
                rank=self.rank,
                time=time.time(),
                env_steps=self.env_steps,
                steps=outcome.env_steps,
                episode_returns=list(outcome.episode_returns),
                step_s=outcome.step_s,
                metrics=outcome.metrics,
                policy_versions=list(outcome.policy_versions),
            ))
            due = config.checkpoint_every and (update + 1) % config.checkpoint_every == 0
            finished = outcome.stop or update + 1 == self.num_updates
            if self.rank == 0 and config.checkpoint_dir and (due or finished):
                state = pack(learner.state_leaves(), update=update + 1,
                                        env_steps=self.env_steps)
                last_saved = save(config.checkpoint_dir, update + 1, state)
            if self.rank == 0 and config.eval_every and (update + 1) % config.eval_every == 0:
                self.board.evaluate.remote(ray.put(learner.policy_numpy()), update + 1,
                                           self.env_steps)
            if outcome.stop:
                break
        learner.finish()
        return {
            "updates": learner.update_count,
            "env_steps": self.env_steps,
            "loop_start": loop_start,
            "checkpoint": last_saved,
            "params": learner.policy_numpy() if self.rank == 0 else None,
            "rollouts_replaced": self.feed.replaced if self.feed is not None else 0,
        }

    def digest(self) -> str:
        return self.learner.digest()


class EvaluatorActor:
    """Greedy evaluations of a run's policy, off the slice (on the cluster's head)."""

    def __init__(self, env_id: str, agent, seed: int, jax_env=None) -> None:
        from workbench.learn.evaluation import GreedyEvaluator

        self.evaluator = GreedyEvaluator(env_id, agent, seed, jax_env)

    def prepare(self, episodes: int) -> None:
        self.evaluator.prepare(episodes)

    def evaluate(self, policy, episodes: int = 20) -> list[float]:
        return self.evaluator.evaluate(policy, episodes)
