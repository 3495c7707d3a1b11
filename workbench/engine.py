"""Training on a reserved slice: learners pinned one per chip, rollout actors beside them.

The thin layer that places work. The driver (a notebook kernel or the CLI) starts the
actors, then only watches: learners pull trajectories from their own rollout actors through
the object store and push one metrics record per update to a small board actor.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.algos.ppo import LossFn, PPOConfig, ppo_loss
from workbench.heap import release_freed_memory
from workbench.metrics import MetricsBoard, UpdateRecord
from workbench.rollout import RolloutKeeper
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
    (gather the batch once per update; one chip learns from it and sends the result to
    the others), or ``"auto"``: ``batch`` for CPU learners (the simulated slice),
    ``gradients`` on TPUs."""
    max_restarts: int = 2
    """Times a run starts again on an intact slice after a learner or a host is lost,
    from the last checkpoint in ``checkpoint_dir`` (from scratch without one)."""

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
        for name in ("eval_every", "checkpoint_every", "seed", "max_restarts"):
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
    restarts: int = 0
    """Times the run started again on an intact slice after losing a learner or host."""
    env_steps_redone: int = 0
    """Env steps learned before a loss and lost with it (after the last checkpoint)."""
    recovery_s: float = 0.0
    """Seconds spent getting an intact slice back after losses."""
    rollout_actors_replaced: int = 0
    """Rollout actors that died and were replaced (their batch in flight was lost)."""
    chip_state_digests: list[str] = field(default_factory=list)
    """SHA-256 of each chip's parameters and optimizer state at the end; all equal."""
    curve: list[dict] = field(default_factory=list)
    params: Any = field(default=None, repr=False)
    """The final network parameters (numpy), e.g. to render the trained policy; not in
    the JSON record."""

    def to_json(self) -> dict:
        record = dataclasses.asdict(dataclasses.replace(self, params=None))
        del record["params"]
        return record


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

        from workbench.ports import free_port

        host = ray.util.get_node_ip_address()
        return f"{host}:{free_port(host)}"

    def join(self, coordinator: str, timeout_s: float) -> float:
        from workbench.learner import configure_jax_platform, current_platform, join_distributed

        configure_jax_platform(current_platform())
        return join_distributed(coordinator, self.num_chips, self.rank, timeout_s)

    def setup(self, config: TrainConfig, loss_fn: LossFn, feed: tuple, board) -> dict:
        import jax

        from workbench import checkpoint
        from workbench.learner import current_platform

        self.config = config
        # (keeper, actor index, part): the rollout actor that feeds this chip, found
        # through the keeper, which replaces it if it dies.
        self.keeper, self.rollout_index, self.part = feed
        self.rollout = None
        self.rollouts_replaced = 0
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
        if self.keeper is not None:
            import ray

            self.rollout = ray.get(self.keeper.actor.remote(self.rollout_index))
        return {"devices": jax.device_count(), "start_update": self.start_update,
                "env_steps": self.env_steps}

    def _sample_all(self, version: int) -> list:
        import ray

        params = ray.put(self.learner.params_numpy())
        return [self.rollout.sample.remote(params, version, self.part)]

    def warm_up(self) -> None:
        """Compile the update before the loop starts, so the loop starts hot."""
        import ray

        if self.config.mode == "anakin":
            self.learner.compile()
        else:
            # A throwaway update on a copy of the state: the actors' update compiles on use.
            leaves, update = self.learner.state_leaves(), self.learner.update_count
            self.learner.update(ray.get(self._sample_all(update)))
            self.learner.load_state_leaves(leaves, update)
        release_freed_memory()

    def request_stop(self) -> None:
        self._stop_requested = True

    def _actors_update(self, update: int) -> tuple:
        """One update from the rollout actors' batches: (result, steps, returns, versions)."""
        import ray

        try:
            batches = ray.get(self._futures)
        except ray.exceptions.RayActorError:
            # The rollout actor died: only its batch in flight is lost. Every learner it
            # fed asks the keeper, which starts one replacement for all of them.
            dead = self.rollout._actor_id.hex()
            self.rollout = ray.get(self.keeper.replace.remote(self.rollout_index, dead))
            self.rollouts_replaced += 1
            log.warning("chip %d: rollout actor %s died; continuing with a new one",
                        self.rank, dead[:8])
            batches = ray.get(self._sample_all(update))
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
            "rollouts_replaced": self.rollouts_replaced,
        }

    def params_digest(self) -> str:
        import hashlib

        digest = hashlib.sha256()
        for leaf in self.learner.state_leaves():
            digest.update(np.ascontiguousarray(leaf).tobytes())
        return digest.hexdigest()


def _remote(cls, **options):
    import ray

    return ray.remote(**options)(cls) if options else ray.remote(cls)


class ChipLost(RuntimeError):
    """A learner of the slice died (killed, or its host was lost)."""


class _Attempt:
    """The learners (and rollout actors) of one attempt at a run on the slice."""

    def __init__(self, tpu_slice: Slice, config: TrainConfig, board, number: int) -> None:
        # Actors are named "<slice>:a<attempt>:learner-<rank>" and "...:rollout-<i>" so
        # that a person (or a fault test) can find them with ray.get_actor.
        self.prefix = f"{tpu_slice.name}:a{number}"
        self.slice = tpu_slice
        self.config = config
        self.board = board
        self.learners: list = []
        self.keeper = None
        self.runs: list = []

    def start(self, loss_fn: LossFn, distributed_timeout_s: float) -> dict:
        """Start every chip's learner, join them, set up and compile. Returns rank 0's
        setup (``start_update``, ``env_steps``)."""
        import ray

        from workbench.learner import DistributedStartError

        started = time.monotonic()
        tpu_slice, config = self.slice, self.config
        num_chips = tpu_slice.num_chips
        Learner = _remote(ChipLearnerActor, num_cpus=1, resources={"TPU": 1},
                          max_concurrency=2)
        self.learners = [
            Learner.options(
                scheduling_strategy=tpu_slice.scheduling(chip.rank),
                name=f"{self.prefix}:learner-{chip.rank}",
            ).remote(chip.rank, num_chips)
            for chip in tpu_slice.chips
        ]
        feeds = self._start_rollouts()
        coordinator = ray.get(self.learners[0].coordinator_address.remote(), timeout=120)
        log.info("learner 0 up after %.1f s", time.monotonic() - started)
        joins = [lr.join.remote(coordinator, distributed_timeout_s) for lr in self.learners]
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
        setups = ray.get([
            lr.setup.remote(config, loss_fn, feed, self.board)
            for lr, feed in zip(self.learners, feeds, strict=True)
        ], timeout=600)
        log.info("learners set up after %.1f s", time.monotonic() - started)
        ray.get([lr.warm_up.remote() for lr in self.learners], timeout=600)
        log.info("learners set up and compiled after %.1f s", time.monotonic() - started)
        return setups[0]

    def _start_rollouts(self) -> list[tuple]:
        """Each host's chips are split among its rollout actors; an actor sits in the
        bundle of the first chip it feeds and serves its chips' learners in rank order.
        Anakin mode has none: each learner steps its own JAX envs."""
        tpu_slice, config = self.slice, self.config
        if config.mode == "anakin":
            return [(None, 0, 0)] * tpu_slice.num_chips
        per_host = config.rollout_actors_per_host
        share = tpu_slice.shape.chips_per_host // per_host
        # Rollout actors never use a TPU: keep JAX on the CPU in their processes.
        cpu_env = {"env_vars": {"JAX_PLATFORMS": "cpu"}}
        specs = []
        fed_by: dict[int, tuple[int, int]] = {}  # chip rank -> (actor index, its part)
        for host in tpu_slice.hosts:
            for k in range(per_host):
                ranks = host.chips[k * share:(k + 1) * share]
                options = dict(num_cpus=1, runtime_env=cpu_env, max_concurrency=share,
                               scheduling_strategy=tpu_slice.scheduling(ranks[0]),
                               name=f"{self.prefix}:rollout-{len(specs)}")
                args = (config.env, config.envs_per_chip, share, config.rollout_length,
                        config.seed * 10_007 + host.worker_id * per_host + k,
                        config.ppo.hidden_sizes)
                for part, rank in enumerate(ranks):
                    fed_by[rank] = (len(specs), part)
                specs.append((options, args))
        self.keeper = _remote(RolloutKeeper, num_cpus=0, max_concurrency=len(fed_by) + 1).options(
            scheduling_strategy=tpu_slice.scheduling(0)
        ).remote(specs)
        return [(self.keeper, *fed_by[rank]) for rank in range(tpu_slice.num_chips)]

    def launch(self) -> None:
        self.runs = [lr.train.remote() for lr in self.learners]

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
        _wait_until_dead([self.learners[rank]._actor_id.hex() for rank in silent], death_s)
        return silent

    def kill(self) -> None:
        import ray

        rollout_ids: list[str] = []
        if self.keeper is not None:
            with contextlib.suppress(Exception):
                rollout_ids = ray.get(self.keeper.stop_all.remote(), timeout=10)
        _kill_and_wait(self.learners + ([self.keeper] if self.keeper else []), rollout_ids)


def _kill_and_wait(handles: list, other_ids: Iterable[str] = (), timeout_s: float = 15.0) -> None:
    """Kill actors and wait (bounded) until the cluster lists them dead, so that a run that
    has returned leaves nothing alive behind it, even for a moment."""
    import ray

    for actor in handles:
        ray.kill(actor)
    ids = [actor._actor_id.hex() for actor in handles] + list(other_ids)
    if not _wait_until_dead(ids, timeout_s):
        log.warning("some of the run's actors were still shutting down after %.0f s", timeout_s)


def _wait_until_dead(actor_ids: list[str], timeout_s: float) -> bool:
    """Poll Ray's actor table until every one of ``actor_ids`` is listed dead (an id it no
    longer lists counts as dead); False if ``timeout_s`` passed first."""
    from ray._private.state import actors

    deadline = time.monotonic() + timeout_s
    while True:
        table = actors()
        if all(table.get(i, {}).get("State", "DEAD") == "DEAD" for i in actor_ids):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _head_node_affinity():
    """Keep run-wide helpers (metrics, evaluation) on the cluster's head, off the slice:
    a lost host must not take the run's history with it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    heads = [n["NodeID"] for n in ray.nodes()
             if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {})]
    node = heads[0] if heads else ray.get_runtime_context().get_node_id()
    # NOTE: hard affinity: Ray was seen to place a soft-affine, zero-CPU actor on a
    # TPU host now and then, and then a lost host took the evaluator with it.
    return NodeAffinitySchedulingStrategy(node, soft=False)


_active_stops: set = set()
"""Stop events of runs in progress in this process; set at interpreter exit."""


def _stop_active_runs(grace_s: float = 4.0) -> None:
    # NOTE: a kernel shutting down (or a CLI exiting) while a run trains in another
    # thread: ask the run to stop, so the learners write a final checkpoint, and give
    # it a few seconds before the process (and with it every actor it owns) goes.
    events = list(_active_stops)
    for event in events:
        event.set()
    deadline = time.monotonic() + grace_s
    while any(event in _active_stops for event in events) and time.monotonic() < deadline:
        time.sleep(0.05)


def train(
    tpu_slice: Slice,
    config: TrainConfig | None = None,
    *,
    loss_fn: LossFn = ppo_loss,
    on_update: Callable[[dict], None] | None = None,
    poll_s: float = 0.5,
    distributed_timeout_s: float = 120.0,
    should_stop: Callable[[], bool] | None = None,
    recover_timeout_s: float = 300.0,
    stop_grace_s: float = 4.0,
) -> TrainResult:
    """Train PPO on every chip of a reserved slice.

    A run survives the loss of a rollout actor (it is replaced; only its batch in flight
    is lost) and of a learner or a host (the slice is given back, an intact one of the
    same shape is reserved in its place on the same handle, and the run carries on from
    the last checkpoint; ``config.max_restarts`` times at most). An interrupt (Ctrl-C,
    a notebook's KeyboardInterrupt, interpreter exit) stops it within ``stop_grace_s``
    after the current update, with a final checkpoint, and re-raises.

    Args:
        tpu_slice: a slice from :func:`workbench.reserve` (``cpus_per_chip`` at least 2
            in actors mode: a learner and, in some bundles, a rollout actor).
        config: what to learn; defaults to PPO on CartPole-v1 for 500k env steps.
        loss_fn: ``loss_fn(params, apply_fn, batch, config) -> (loss, metrics)``; the PPO
            loss unless you plug in your own.
        on_update: called on the driver with each new update's aggregated metrics (after a
            restart, the updates redone from the checkpoint come again).
        poll_s: how often the driver reads the metrics board.
        distributed_timeout_s: deadline for the learners to form one jax.distributed group.
        should_stop: polled with the metrics; returning True ends training cleanly after the
            current update (with a final checkpoint).
        recover_timeout_s: how long to wait for an intact slice after a lost host.
        stop_grace_s: how long an interrupted run may take to stop cleanly.

    Returns:
        The run's :class:`TrainResult`.

    Raises:
        ValueError: a config that cannot work (nothing is started).
        DistributedStartError: the learners did not join in time; names the missing ranks.
        ChipLost: learners were lost more than ``config.max_restarts`` times.
        SliceUnavailableError: no intact slice came back after a loss.
    """
    import threading

    import ray

    from workbench import checkpoint
    from workbench.rollout import RolloutWorker

    config = config or TrainConfig()
    config.validate()
    _validate_env(config.env, config.mode)
    if tpu_slice.released:
        raise ValueError("This slice has been released; reserve a slice and train on that.")
    chips_per_host = tpu_slice.shape.chips_per_host
    if config.mode == "actors" and chips_per_host % config.rollout_actors_per_host:
        raise ValueError(
            f"rollout_actors_per_host={config.rollout_actors_per_host} does not divide the "
            f"{chips_per_host} chips of a {tpu_slice.shape.label} host; use a divisor of "
            f"{chips_per_host}."
        )
    if config.mode == "actors" and tpu_slice.cpus_per_chip < 2:
        raise ValueError(
            f"Each chip's bundle has {tpu_slice.cpus_per_chip} CPU(s); a learner and a "
            "rollout actor placed beside it need 2: reserve with cpus_per_chip=2."
        )
    started = time.monotonic()
    num_chips = tpu_slice.num_chips
    stop_event = threading.Event()
    _active_stops.add(stop_event)
    # Exit handlers run last-registered first: this one must run before Ray's own (added
    # by ray.init, earlier), which would take the actors away before they could checkpoint.
    atexit.unregister(_stop_active_runs)
    atexit.register(_stop_active_runs)
    helpers: list = []
    attempt: _Attempt | None = None
    restarts = env_steps_redone = 0
    recovery_s = 0.0
    loop_start: float | None = None
    startup_s = 0.0
    try:
        placement = {"scheduling_strategy": _head_node_affinity()}
        cpu_env = {"env_vars": {"JAX_PLATFORMS": "cpu"}}
        evaluator = _remote(RolloutWorker, num_cpus=0, runtime_env=cpu_env).options(
            **placement
        ).remote(config.env, 1, 1, config.seed + 999_983, config.ppo.hidden_sizes)
        evaluator_ready = evaluator.prepare_evaluation.remote(config.eval_episodes)
        board = _remote(MetricsBoard, num_cpus=0).options(**placement).remote(
            num_chips, config.target_return, config.eval_episodes, evaluator
        )
        helpers += [evaluator, board]
        attempt_config = config
        seen = 0
        last_env_steps = 0
        while True:
            attempt = _Attempt(tpu_slice, attempt_config, board, restarts)
            try:
                setup = attempt.start(loss_fn, distributed_timeout_s)
                if restarts:
                    env_steps_redone += max(0, last_env_steps - setup["env_steps"])
                    seen = setup["start_update"]
                    ray.get(board.rewind.remote(seen))
                else:
                    ray.get(evaluator_ready)
                    startup_s = time.monotonic() - started
                attempt.launch()
                loop_start = loop_start or time.time()
                stop_sent = False
                while True:
                    finished = attempt.finished(poll_s)
                    snapshot = ray.get(board.snapshot.remote(seen))
                    for row in snapshot["updates"]:
                        seen = row["update"]
                        last_env_steps = row["env_steps"]
                        if on_update is not None:
                            on_update(row)
                    wants_stop = (
                        stop_event.is_set()
                        or (should_stop is not None and should_stop())
                        or (config.stop_at_target and snapshot["train_target_update"] is not None)
                    )
                    if wants_stop and not stop_sent:
                        attempt.request_stop()
                        stop_sent = True
                    if finished:
                        break
                break
            except ChipLost as lost:
                if restarts >= config.max_restarts:
                    raise ChipLost(
                        f"{lost} (after {restarts} restart(s), the most config.max_restarts "
                        "allows). Check the cluster's hosts with wb.list_slices()."
                    ) from lost
                log.warning("%s; restarting on an intact slice", lost)
                attempt.kill()
                recovering = time.monotonic()
                tpu_slice.recover(timeout_s=recover_timeout_s)
                restarts += 1
                has_checkpoint = bool(config.checkpoint_dir) and (
                    checkpoint.latest_step(config.checkpoint_dir) is not None
                )
                attempt_config = dataclasses.replace(config, resume=has_checkpoint)
                recovery_s += time.monotonic() - recovering
            except KeyboardInterrupt:
                # NOTE: stop after the current update (rank 0 writes a final checkpoint),
                # within the grace period; a second interrupt ends it at once.
                if attempt.runs:
                    with contextlib.suppress(Exception):
                        attempt.request_stop()
                        ray.wait(attempt.runs, num_returns=len(attempt.runs),
                                 timeout=stop_grace_s)
                raise
        outcomes = ray.get(attempt.runs)
        digests = ray.get([lr.params_digest.remote() for lr in attempt.learners])
        final = ray.get(evaluator.evaluate.remote(outcomes[0]["params"], config.eval_episodes))
        # Every chip's pushes were sent before its train() returned; read the history.
        summary = ray.get(board.snapshot.remote(0, True))
    finally:
        _active_stops.discard(stop_event)
        if attempt is not None:
            attempt.kill()
        _kill_and_wait(helpers)
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
        restarts=restarts,
        env_steps_redone=env_steps_redone,
        recovery_s=round(recovery_s, 3),
        rollout_actors_replaced=max(o["rollouts_replaced"] for o in outcomes),
        chip_state_digests=digests,
        curve=summary["updates"],
        params=outcomes[0]["params"],
    )


def _since(t: float | None, start: float) -> float | None:
    return None if t is None else round(t - start, 3)
