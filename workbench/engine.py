"""Training on a reserved slice: learners pinned one per chip, rollout actors beside them.

The thin layer that places work. The driver (a notebook kernel or the CLI) starts the
actors, then only watches: learners pull trajectories from their own rollout actors through
the object store and push one metrics record per update to a small board actor.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from workbench.algos.ppo import LossFn, PPOConfig, ppo_loss
from workbench.metrics import MetricsBoard, UpdateRecord
from workbench.slice import Slice

log = logging.getLogger(__name__)

TARGET_RETURN = 475.0
MODES = ("actors", "anakin")


@dataclass(frozen=True)
class TrainConfig:
    """What a run learns, and for how long. Where it runs is the reserved slice."""

    env: str = "CartPole-v1"
    """A registered gymnasium id with a Discrete action space; in Anakin mode one of the
    project's JAX environments (``workbench.envs.jax_env_ids()``)."""
    mode: str = "actors"
    """``"actors"``: gymnasium envs stepped by rollout actors on the hosts' CPUs.
    ``"anakin"``: JAX envs stepped on each chip, rollout and update in one program."""
    total_env_steps: int = 500_000
    """Budget of environment steps over all chips."""
    seed: int = 0
    """Seeds parameters, environments and sampling; same seed and slice, same curve."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """Algorithm hyperparameters."""
    rollout_actors_per_host: int = 1
    """Rollout actors on each host; each feeds an equal share of the host's learners."""
    envs_per_chip: int = 16
    """Environments stepped for each chip's learner per rollout."""
    rollout_length: int = 64
    """Steps per environment in one rollout."""
    eval_every: int = 5
    """Updates between greedy evaluations (0: only the final one)."""
    eval_episodes: int = 20
    """Episodes per greedy evaluation."""
    target_return: float = TARGET_RETURN
    """Return both targets are measured against."""
    stop_at_target: bool = False
    """End the run once the training target is reached (benchmarks)."""
    checkpoint_dir: str | None = None
    """Where orbax checkpoints go; ``None`` for no checkpoints."""
    checkpoint_every: int = 0
    """Updates between checkpoints (a final one is always written when a dir is set)."""
    resume: bool = False
    """Continue from the latest checkpoint in ``checkpoint_dir``."""
    sync: str = "auto"
    """How chips stay equal: ``"gradients"`` (an all-reduce per minibatch), ``"batch"``
    (gather the batch once per update, identical steps on every chip), or ``"auto"``:
    ``batch`` for CPU learners (the simulated slice), ``gradients`` on TPUs."""

    @property
    def steps_per_update(self) -> int:
        """Env steps each chip learns from per update."""
        return self.envs_per_chip * self.rollout_length

    def num_updates(self, num_chips: int) -> int:
        return max(1, self.total_env_steps // (self.steps_per_update * num_chips))

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field that cannot work."""
        positive = ("total_env_steps", "rollout_actors_per_host", "envs_per_chip",
                    "rollout_length", "eval_episodes")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive whole number, got {value!r}.")
        if self.total_env_steps > 10**10:
            raise ValueError(f"total_env_steps={self.total_env_steps} is beyond any run here.")
        for name in ("eval_every", "checkpoint_every", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0, got {value!r}.")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("resume=True needs checkpoint_dir: the run to continue from.")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}.")
        if self.sync not in ("auto", "gradients", "batch"):
            raise ValueError(f"sync must be 'auto', 'gradients' or 'batch', got {self.sync!r}.")
        if self.ppo.num_minibatches <= 0 or self.ppo.num_epochs <= 0:
            raise ValueError("ppo.num_minibatches and ppo.num_epochs must be positive.")


@dataclass
class TrainResult:
    """The record a run leaves (also written by ``workbench train --json``)."""

    env_steps: int
    wall_s: float
    final_return: float
    env_steps_per_s: float
    time_to_eval_target_s: float | None
    time_to_train_target_s: float | None
    env_steps_to_train_target: int | None
    startup_s: float
    generation: str
    topology: str
    chips: int
    hosts: int
    mode: str
    algo: str
    env: str
    seed: int
    updates: int
    checkpoint: str | None
    chip_state_digests: list[str] = field(default_factory=list)
    """SHA-256 of each chip's parameters and optimizer state at the end; all equal."""
    curve: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _validate_env(env_id: str, mode: str) -> None:
    import gymnasium as gym

    from workbench.envs import jax_env_ids

    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"env must be a gymnasium id such as 'CartPole-v1', got {env_id!r}.")
    if mode == "anakin":
        if env_id not in jax_env_ids():
            raise ValueError(
                f"Anakin mode steps JAX environments on the chip, and {env_id!r} is not one. "
                f"JAX environments: {', '.join(jax_env_ids())}. Use one of them, or "
                "mode='actors' for any gymnasium environment."
            )
        return
    if env_id not in gym.registry:
        close = [k for k in gym.registry if env_id.lower().split("-")[0] in k.lower()][:5]
        hint = f" Similar ids: {', '.join(close)}." if close else ""
        raise ValueError(
            f"Unknown environment {env_id!r}: not registered with gymnasium.{hint} "
            "Use a registered id (e.g. 'CartPole-v1') or register yours first."
        )


class ChipLearnerActor:
    """One chip's learner process (a Ray actor pinned to the chip's bundle)."""

    def __init__(self, rank: int, num_chips: int) -> None:
        self.rank = rank
        self.num_chips = num_chips
        self._stop_requested = False

    def coordinator_address(self) -> str:
        import ray

        from workbench.learner import free_port

        host = ray.util.get_node_ip_address()
        return f"{host}:{free_port(host)}"

    def join(self, coordinator: str, timeout_s: float) -> float:
        from workbench.learner import configure_jax_platform, current_platform, join_distributed

        configure_jax_platform(current_platform())
        return join_distributed(coordinator, self.num_chips, self.rank, timeout_s)

    def setup(self, config: TrainConfig, loss_fn: LossFn, rollout, part: int, board) -> dict:
        import jax

        from workbench import checkpoint
        from workbench.learner import current_platform

        self.config = config
        self.rollout = rollout
        self.part = part
        self.board = board
        self.num_updates = config.num_updates(self.num_chips)
        gather = config.sync == "batch" or (config.sync == "auto" and current_platform() == "cpu")
        if config.mode == "anakin":
            from workbench.anakin import AnakinLearner
            from workbench.envs import make_jax

            self.learner = AnakinLearner(
                make_jax(config.env), config.envs_per_chip, config.rollout_length, config.ppo,
                self.num_updates, config.seed, loss_fn, gather,
            )
        else:
            from workbench.learner import Learner
            from workbench.rollout import env_spaces

            obs, num_actions = env_spaces(config.env)
            self.learner = Learner(
                obs, num_actions, config.ppo, self.num_updates, config.seed, loss_fn, gather
            )
        self.start_update = 0
        self.env_steps = 0
        if config.resume:
            saved = checkpoint.restore(config.checkpoint_dir)
            self.learner.load_state_leaves(checkpoint.unpack(saved), int(saved["update"]))
            self.start_update = int(saved["update"])
            self.env_steps = int(saved["env_steps"])
        return {"devices": jax.device_count(), "start_update": self.start_update}

    def _sample_all(self, version: int) -> list:
        import ray

        params = ray.put(self.learner.params_numpy())
        return [self.rollout.sample.remote(params, version, self.part)]

    def warm_up(self) -> None:
        """Compile the update before the loop starts, so the loop starts hot."""
        import ray

        if self.config.mode == "anakin":
            self.learner.compile()
            return
        # A throwaway update on a copy of the state: the actors' update compiles on use.
        leaves, update = self.learner.state_leaves(), self.learner.update_count
        self.learner.update(ray.get(self._sample_all(update)))
        self.learner.load_state_leaves(leaves, update)

    def request_stop(self) -> None:
        self._stop_requested = True

    def _actors_update(self, update: int) -> tuple:
        """One update from the rollout actors' batches: (result, steps, returns, versions)."""
        import ray

        batches = ray.get(self._futures)
        # NOTE: the next rollout starts now with the current parameters and runs while
        # this update computes, so rollouts are exactly one policy version behind the
        # learner, on every chip and every run alike (reproducible).
        self._futures = self._sample_all(update + 1)
        result = self.learner.update(batches, stop=self._stop_requested)
        steps = sum(b.env_steps for b in batches) * self.num_chips
        returns = [r for b in batches for r in b.episode_returns]
        return result, steps, returns, [b.policy_version for b in batches]

    def _anakin_update(self, update: int) -> tuple:
        result = self.learner.step(stop=self._stop_requested)
        return result, self.learner.steps_per_update, list(result.episode_returns), [update]

    def train(self) -> dict:
        import ray

        from workbench import checkpoint

        config = self.config
        anakin = config.mode == "anakin"
        self._futures = [] if anakin else self._sample_all(self.start_update)
        next_update = self._anakin_update if anakin else self._actors_update
        last_saved = None
        loop_start = time.time()
        for update in range(self.start_update, self.num_updates):
            result, steps, returns, versions = next_update(update)
            self.env_steps += steps
            record = UpdateRecord(
                update=update + 1,
                rank=self.rank,
                time=time.time(),
                env_steps=self.env_steps,
                steps=steps,
                episode_returns=returns,
                step_s=result.step_s,
                metrics=result.metrics,
                policy_versions=versions,
            )
            self.board.record.remote(record)
            due = config.checkpoint_every and (update + 1) % config.checkpoint_every == 0
            finished = result.stop or update + 1 == self.num_updates
            if self.rank == 0 and config.checkpoint_dir and (due or finished):
                state = checkpoint.pack(
                    self.learner.state_leaves(), update=update + 1, env_steps=self.env_steps
                )
                last_saved = checkpoint.save(config.checkpoint_dir, update + 1, state)
            if self.rank == 0 and config.eval_every and (update + 1) % config.eval_every == 0:
                params = ray.put(self.learner.params_numpy())
                self.board.evaluate.remote(params, update + 1, self.env_steps)
            if result.stop:
                break
        ray.get(self._futures)
        return {
            "updates": self.learner.update_count,
            "env_steps": self.env_steps,
            "loop_start": loop_start,
            "checkpoint": last_saved,
            "params": self.learner.params_numpy() if self.rank == 0 else None,
        }

    def params_digest(self) -> str:
        import hashlib

        digest = hashlib.sha256()
        for leaf in self.learner.state_leaves():
            digest.update(np.ascontiguousarray(leaf).tobytes())
        return digest.hexdigest()


def _remote(cls, **options):
    import ray

    return ray.remote(**options)(cls)


def train(
    tpu_slice: Slice,
    config: TrainConfig | None = None,
    *,
    loss_fn: LossFn = ppo_loss,
    on_update: Callable[[dict], None] | None = None,
    poll_s: float = 0.5,
    distributed_timeout_s: float = 120.0,
    should_stop: Callable[[], bool] | None = None,
) -> TrainResult:
    """Train PPO on every chip of a reserved slice.

    Args:
        tpu_slice: a slice from :func:`workbench.reserve` with ``cpus_per_chip`` at least
            2 (a learner and, in some bundles, a rollout actor).
        config: what to learn; defaults to PPO on CartPole-v1 for 500k env steps.
        loss_fn: ``loss_fn(params, apply_fn, batch, config) -> (loss, metrics)``; the PPO
            loss unless you plug in your own.
        on_update: called on the driver with each new update's aggregated metrics.
        poll_s: how often the driver reads the metrics board.
        distributed_timeout_s: deadline for the learners to form one jax.distributed group.
        should_stop: polled with the metrics; returning True ends training cleanly after the
            current update (with a final checkpoint).

    Returns:
        The run's :class:`TrainResult`.

    Raises:
        ValueError: a config that cannot work (nothing is started).
        DistributedStartError: the learners did not join in time; names the missing ranks.
    """
    import ray

    from workbench.learner import DistributedStartError

    config = config or TrainConfig()
    config.validate()
    _validate_env(config.env, config.mode)
    if tpu_slice.released:
        raise ValueError("This slice has been released; reserve a slice and train on that.")
    chips_per_host = tpu_slice.shape.chips_per_host
    actors_per_host = config.rollout_actors_per_host
    if chips_per_host % actors_per_host:
        raise ValueError(
            f"rollout_actors_per_host={actors_per_host} does not divide the "
            f"{chips_per_host} chips of a {tpu_slice.shape.label} host; use a divisor of "
            f"{chips_per_host}."
        )
    if config.mode == "actors" and tpu_slice.cpus_per_chip < 2:
        raise ValueError(
            f"Each chip's bundle has {tpu_slice.cpus_per_chip} CPU(s); a learner and a "
            "rollout actor placed beside it need 2: reserve with cpus_per_chip=2."
        )
    started = time.monotonic()
    from workbench.rollout import RolloutWorker, SharedRollout

    num_chips = tpu_slice.num_chips
    # Rollout actors never use a TPU: keep JAX on the CPU in their processes.
    cpu_env = {"env_vars": {"JAX_PLATFORMS": "cpu"}}
    actors: list = []
    try:
        Evaluator = _remote(RolloutWorker, num_cpus=0, runtime_env=cpu_env)
        Rollout = _remote(SharedRollout, num_cpus=1, runtime_env=cpu_env)
        Learner = _remote(
            ChipLearnerActor,
            num_cpus=1,
            resources={"TPU": 1},
            max_concurrency=2,
        )
        evaluator = Evaluator.options(scheduling_strategy=tpu_slice.scheduling(0)).remote(
            config.env, 1, 1, config.seed + 999_983, config.ppo.hidden_sizes
        )
        board = _remote(MetricsBoard, num_cpus=0).options(
            scheduling_strategy=tpu_slice.scheduling(0)
        ).remote(num_chips, config.target_return, config.eval_episodes, evaluator)
        actors += [evaluator, board]
        learners = [
            Learner.options(scheduling_strategy=tpu_slice.scheduling(chip.rank)).remote(
                chip.rank, num_chips
            )
            for chip in tpu_slice.chips
        ]
        # Each host's chips are split among its rollout actors; an actor sits in the
        # bundle of the first chip it feeds and serves its chips' learners in rank order.
        share = chips_per_host // actors_per_host
        feeds: list[tuple] = [(None, 0)] * num_chips
        rollouts = []
        # Anakin mode has no rollout actors: each learner steps its own JAX envs.
        hosts = tpu_slice.hosts if config.mode == "actors" else []
        for host in hosts:
            for k in range(actors_per_host):
                ranks = host.chips[k * share:(k + 1) * share]
                actor = Rollout.options(
                    scheduling_strategy=tpu_slice.scheduling(ranks[0]), max_concurrency=share
                ).remote(
                    config.env,
                    config.envs_per_chip,
                    share,
                    config.rollout_length,
                    config.seed * 10_007 + host.worker_id * actors_per_host + k,
                    config.ppo.hidden_sizes,
                )
                rollouts.append(actor)
                for part, rank in enumerate(ranks):
                    feeds[rank] = (actor, part)
        actors += learners + rollouts
        coordinator = ray.get(learners[0].coordinator_address.remote(), timeout=120)
        log.info("learner 0 up after %.1f s", time.monotonic() - started)
        joins = [lr.join.remote(coordinator, distributed_timeout_s) for lr in learners]
        ready, _ = ray.wait(joins, num_returns=len(joins), timeout=distributed_timeout_s + 30)
        missing = [rank for rank, ref in enumerate(joins) if ref not in ready]
        if missing:
            raise DistributedStartError(
                f"Learners of ranks {missing} (of {num_chips}) did not join the jax.distributed "
                f"group at {coordinator} within {distributed_timeout_s:g} s. Check that their "
                "hosts are alive (wb.list_slices()) and retry, or raise distributed_timeout_s."
            )
        ray.get(joins)
        log.info("jax.distributed joined after %.1f s", time.monotonic() - started)
        ray.get([
            lr.setup.remote(config, loss_fn, actor, part, board)
            for lr, (actor, part) in zip(learners, feeds, strict=True)
        ], timeout=600)
        log.info("learners set up after %.1f s", time.monotonic() - started)
        ray.get([lr.warm_up.remote() for lr in learners], timeout=600)
        log.info("warm-up compiled after %.1f s", time.monotonic() - started)
        startup_s = time.monotonic() - started
        runs = [lr.train.remote() for lr in learners]
        seen = 0
        stop_sent = False
        while True:
            done, _ = ray.wait(runs, num_returns=len(runs), timeout=poll_s)
            snapshot = ray.get(board.snapshot.remote(seen))
            for row in snapshot["updates"]:
                seen = row["update"]
                if on_update is not None:
                    on_update(row)
            wants_stop = (should_stop is not None and should_stop()) or (
                config.stop_at_target and snapshot["train_target_update"] is not None
            )
            if wants_stop and not stop_sent:
                ray.get(learners[0].request_stop.remote())
                stop_sent = True
            if len(done) == len(runs):
                break
        outcomes = ray.get(runs)
        digests = ray.get([lr.params_digest.remote() for lr in learners])
        final = ray.get(evaluator.evaluate.remote(outcomes[0]["params"], config.eval_episodes))
        # Every chip's pushes were sent before its train() returned; read the history.
        summary = ray.get(board.snapshot.remote(0, True))
    finally:
        for actor in actors:
            ray.kill(actor)
    loop_start = min(o["loop_start"] for o in outcomes)
    loop_end = max(r["time"] for r in summary["updates"]) if summary["updates"] else loop_start
    wall_s = loop_end - loop_start
    steps_run = sum(row["steps_this_update"] for row in summary["updates"])
    return TrainResult(
        env_steps=outcomes[0]["env_steps"],
        wall_s=round(wall_s, 3),
        final_return=float(np.mean(final)),
        env_steps_per_s=round(steps_run / wall_s, 1) if wall_s > 0 else 0.0,
        time_to_eval_target_s=_since(summary["eval_target_time"], loop_start),
        time_to_train_target_s=_since(summary["train_target_time"], loop_start),
        env_steps_to_train_target=summary["train_target_env_steps"],
        startup_s=round(startup_s, 3),
        generation=tpu_slice.shape.generation.name,
        topology=tpu_slice.shape.topology,
        chips=num_chips,
        hosts=tpu_slice.num_hosts,
        mode=config.mode,
        algo="ppo" if loss_fn is ppo_loss else getattr(loss_fn, "__name__", "custom"),
        env=config.env,
        seed=config.seed,
        updates=outcomes[0]["updates"],
        checkpoint=outcomes[0]["checkpoint"],
        chip_state_digests=digests,
        curve=summary["updates"],
    )


def _since(t: float | None, start: float) -> float | None:
    return None if t is None else round(t - start, 3)
