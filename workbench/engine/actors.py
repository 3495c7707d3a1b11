"""The actors a run places on the slice: one learner per chip.

Each is a plain class that Ray runs as an actor pinned to a bundle; the learning itself is
the learn layer's (:mod:`workbench.learn`), which knows nothing of Ray.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from workbench.engine.config import TrainConfig
from workbench.engine.metrics import ReturnWindow, UpdateRecord
from workbench.engine.rollouts import FeedSpec
from workbench.learn.heap import release_freed_memory
from workbench.learn.joined_mesh import MeshView, check_same_state
from workbench.learn.learner import LearnerSetup
from workbench.tpu.process_env import ChipProcess


@dataclass(frozen=True)
class Checkpoints:
    """Where a run's checkpoints go and what each records of the run."""

    directory: str
    identity: dict
    """The run's identity (see :mod:`workbench.engine.checkpoint`), with the slice."""
    resume: bool = False
    """Continue from the newest checkpoint that checks out."""


@dataclass(frozen=True)
class JoinReport:
    """What a chip's process answers once it has joined its slice's group."""

    seconds: float
    process: ChipProcess
    """What it described of itself before the join."""
    mesh: MeshView
    """What it saw after."""


@dataclass(frozen=True)
class LearnerReady:
    """What a chip's learner answers once it is set up for a run (and resumed from the
    checkpoint when asked)."""

    devices: int
    """JAX's global device count as this process sees it (every chip of the slice)."""
    start_update: int
    """The update the run continues from (0 for a fresh run)."""
    env_steps: int
    """Env steps of the run up to ``start_update``."""
    exact: bool = True
    """Whether the resume restored the environments too (always so for a fresh run)."""
    window: ReturnWindow | None = None
    """The rolling window of returns the checkpoint recorded (rank 0, resumed, when its
    board answered at the save)."""
    step: int | None = None
    """The checkpoint step resumed from."""


@dataclass(frozen=True)
class TrainOutcome:
    """What a chip's learner answers when its training loop has ended."""

    updates: int
    """Updates the learner has done, counting those before a resume."""
    env_steps: int
    """Env steps of the whole run, over all chips."""
    loop_start: float
    """When this attempt's loop started (``time.time()``)."""
    checkpoint: str | None
    """The last checkpoint this chip wrote (rank 0 only; None elsewhere)."""
    params: Any
    """The final policy's parameters as numpy (rank 0 only)."""
    rollouts_replaced: int
    """Rollout actors that died and were replaced while they fed this chip."""
    digest: str
    """A digest of the chip's learner state after its last update. Taken in the loop,
    not asked for afterwards: a chip lost after its last update would otherwise fail a
    run that has finished."""


TPU_PORT_BASE = 8476
"""libtpu's port for the process holding chip c is this plus c, as pytorch/xla numbers
them (``torch_xla/_internal/tpu.py``): unique on a host, never libtpu's default 8471
(processes sharing a host collided there, ray-project/ray#66029), and the same for a
chip on every run, so no two processes can pick one port at once."""


def libtpu_port(visible_chips: str | None) -> int | None:
    """The port for the process that holds the one chip ``visible_chips`` names."""
    if visible_chips is None or not visible_chips.strip().isdigit():
        return None
    return TPU_PORT_BASE + int(visible_chips)


log = logging.getLogger(__name__)

RECORDS_KEPT = 1024
"""Per chip, how many of its latest update records a replacement board gets again."""


class ChipLearnerActor:
    """One chip's learner process (a Ray actor pinned to the chip's bundle)."""

    def __init__(self, rank: int, num_chips: int) -> None:
        import threading
        from collections import deque

        self.rank = rank
        self.num_chips = num_chips
        self._stop_requested = False
        self._recent: deque[UpdateRecord] = deque(maxlen=RECORDS_KEPT)
        """This chip's latest records, sent again to a board that replaces a lost one."""
        self._records_lock = threading.Lock()
        self._setting_up = threading.Lock()
        """Held by a warm-up and by a run's set-up: a run that comes during the warm-up
        sets up after it, not beside it in the actor's second thread."""

    def describe_process(self):
        """What this process is before JAX starts its backend: its host, the chip Ray
        gave it (``TPU_VISIBLE_CHIPS``) and the ports it can offer (a
        :class:`~workbench.tpu.process_env.ChipProcess`)."""
        import os

        import ray

        from workbench.learn.joined_mesh import tpu_environment
        from workbench.tpu.ports import free_port

        host = ray.util.get_node_ip_address()
        return ChipProcess(
            rank=self.rank,
            worker_id=int(os.environ.get("TPU_WORKER_ID", "0")),
            address=host,
            environment=dict(tpu_environment()),
            tpu_port=libtpu_port(os.environ.get("TPU_VISIBLE_CHIPS")) or free_port(host),
            coordinator_port=free_port(host),
        )

    def join(self, shape, timeout_s: float, *processes) -> JoinReport:
        """Take this process's TPU environment from the slice's ``processes`` (what
        :meth:`describe_process` gave on every chip), join the group, start the backend
        and report what it sees of the mesh.

        Raises:
            ProcessLayoutError: the processes do not make one slice of ``shape``.
        """
        import os

        import ray

        from workbench.learn.joined_mesh import ExpectedMesh, look_at_mesh
        from workbench.learn.platform import (
            configure_jax_platform,
            current_platform,
            join_distributed,
        )
        from workbench.tpu.process_env import chip_layout

        layout = chip_layout(shape, processes)
        mine = layout.for_rank(self.rank)
        # NOTE: before the platform is configured: libtpu reads these when the backend
        # starts, and Ray's one-chip bounds would make this process a slice of its own.
        mine.apply(os.environ)
        platform = current_platform()
        configure_jax_platform(platform)
        own = ray.util.get_node_ip_address() if platform == "cpu" else None
        seconds = join_distributed(layout.coordinator, self.num_chips, mine.process_id,
                                   timeout_s, own)
        expected = ExpectedMesh(devices=self.num_chips, processes=self.num_chips,
                                process_index=mine.process_id, local_devices=1)
        self.joined = JoinReport(seconds, processes[self.rank], look_at_mesh(self.rank, expected))
        return self.joined

    def join_report(self) -> JoinReport | None:
        """What this process reported when it joined (None before)."""
        return getattr(self, "joined", None)

    def time_psum(self) -> tuple[float, float, float]:
        """A psum over every chip of the joined group (see ``workbench doctor --mesh``)."""
        from workbench.learn.joined_mesh import time_psum

        return time_psum()

    def warm_up(self, plan, joined: float | None = None) -> None:
        """Set up and compile the learner of a run with ``plan`` (the defaults) as a run
        would, on every chip together, and keep only its programs. A process's first set-up
        pays for JAX's own (its devices, tracing's and lowering's caches, the compile
        cache's first read), which the first run then skips whatever its config; a run of
        the same config but its seed also skips tracing its programs (see
        ``ChipLearner._lowered``). ``joined``: the join's result, so that Ray runs this
        after the join."""
        from workbench.learn import sync as sync_strategies
        from workbench.learn.modes import learner_class
        from workbench.learn.platform import current_platform

        with self._setting_up:
            sync = sync_strategies.resolve(plan.config.sync, current_platform())
            setup = plan.learner_setup(self.num_chips, sync)
            # No source: a warm-up asks for no batch.
            learner_class(plan.config.mode)(setup, None).compile()
        release_freed_memory()

    def setup(self, config: TrainConfig, setup: LearnerSetup, mode: str,
              feed: FeedSpec | None, board, checkpoints: Checkpoints) -> LearnerReady:
        """Build this chip's learner, and resume it from the checkpoint when asked.

        Returns what the driver needs of the resume: the update and env steps it continues
        from, whether the environments were restored exactly, and (rank 0) the rolling
        window of returns the checkpoint recorded."""
        with self._setting_up:
            return self._setup(config, setup, mode, feed, board, checkpoints)

    def _setup(self, config: TrainConfig, setup: LearnerSetup, mode: str,
               feed: FeedSpec | None, board, checkpoints: Checkpoints) -> LearnerReady:
        import jax

        from workbench.engine.checkpoint import restore
        from workbench.engine.rollouts import RolloutFeed
        from workbench.learn.modes import learner_class

        self._stop_requested = False
        with self._records_lock:
            self._recent.clear()
        self.config = config
        self.checkpoints = checkpoints
        self.board = board
        self.num_updates = setup.agent.num_updates
        self.feed = RolloutFeed(feed, rank=self.rank) if feed is not None else None
        self.learner = learner_class(mode)(setup, self.feed)
        self.start_update = 0
        self.env_steps = 0
        if not checkpoints.resume:
            return LearnerReady(jax.device_count(), self.start_update, self.env_steps)
        restored = restore(checkpoints.directory)
        self.learner.load_state_leaves(restored.state, restored.update)
        self.start_update, self.env_steps = restored.update, restored.env_steps
        exact = self.learner.load_resume_state(restored.resume)
        if self.feed is not None and self.rank == 0:
            import ray

            exact &= ray.get(self.feed.keeper.restore.remote(restored.rollouts))
        window = restored.meta.get("metrics")
        return LearnerReady(
            devices=jax.device_count(), start_update=self.start_update,
            env_steps=self.env_steps, exact=exact,
            window=ReturnWindow.from_json(window) if window else None, step=restored.step,
        )

    def clear(self) -> None:
        """Drop the finished run's learner and buffers, so that a process kept warm for
        the next run holds no more than its imports and its jax.distributed membership."""
        import gc

        self.learner = self.feed = self.board = None
        with self._records_lock:
            self._recent.clear()
        gc.collect()
        release_freed_memory()

    def compile(self) -> float:
        """Compile the update before the loop starts, so the loop starts hot."""
        seconds = self.learner.compile()
        release_freed_memory()
        return seconds

    def request_stop(self) -> None:
        self._stop_requested = True

    def set_board(self, board, since: int = 0) -> None:
        """Report to a new metrics board (the driver replaced a lost one), sending it again
        this chip's recent records of updates after ``since`` (the last row the driver
        saw): those that went to the lost board would be missing from the curve."""
        with self._records_lock:
            self.board = board
            for record in self._recent:
                if record.update > since:
                    board.record.remote(record)

    def _push(self, record: UpdateRecord) -> None:
        with self._records_lock:
            self._recent.append(record)
            self.board.record.remote(record)

    def _checkpoint_due(self, update: int, last_saved_at: float) -> bool:
        """Rank 0 asks for checkpoints (the others learn of it through the update)."""
        every, every_s = self.config.checkpoint_every, self.config.checkpoint_every_s
        return self.rank == 0 and (
            bool(every and (update + 1) % every == 0)
            or bool(every_s and time.monotonic() - last_saved_at >= every_s)
        )

    def train(self) -> TrainOutcome:
        config, learner = self.config, self.learner
        last_saved, last_saved_at = None, time.monotonic()
        loop_start = time.time()
        for update in range(self.start_update, self.num_updates):
            outcome = learner.step(stop=self._stop_requested,
                                   checkpoint=self._checkpoint_due(update, last_saved_at))
            self.env_steps += outcome.env_steps
            self._push(UpdateRecord(
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
            if update == self.start_update:
                # Once a run: a mesh that formed wrong shows here as chips that differ.
                check_same_state(learner.digest())
            finished = outcome.stop or update + 1 == self.num_updates
            if outcome.checkpoint or finished:
                # NOTE: every chip gets here after the same update (they agreed on it in the
                # update's collective), as gathering what makes a resume exact may need.
                resume = learner.resume_state()
                if self.rank == 0:
                    last_saved = self._save(update + 1, resume)
                    last_saved_at = time.monotonic()
            if self.rank == 0 and config.eval_every and (update + 1) % config.eval_every == 0:
                self.board.evaluate.remote(learner.policy_numpy(), update + 1, self.env_steps)
            if outcome.stop:
                break
        learner.finish()
        return TrainOutcome(
            updates=learner.update_count,
            env_steps=self.env_steps,
            loop_start=loop_start,
            checkpoint=last_saved,
            params=learner.policy_numpy() if self.rank == 0 else None,
            rollouts_replaced=self.feed.replaced if self.feed is not None else 0,
            digest=learner.digest(),
        )

    def _save(self, update: int, resume: dict) -> str:
        import ray

        from workbench.engine.checkpoint import save

        rollouts: list = []
        if self.feed is not None:
            # The rollout in flight (for update + 1) started from these envs.
            rollouts = ray.get(self.feed.keeper.snapshots.remote(update), timeout=60)
            if any(blob is None for blob in rollouts):
                rollouts = []
        try:
            window = ray.get(self.board.window.remote(update), timeout=30)
        except Exception:  # the board may be gone; the driver replaces it
            window = None
        meta = {**self.checkpoints.identity, "update": update, "env_steps": self.env_steps,
                "metrics": window.to_json() if window is not None else None}
        return save(self.checkpoints.directory, update, self.learner.state_leaves(), meta,
                    resume=resume, rollouts=rollouts)
