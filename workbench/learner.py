"""The learner of one chip: holds the parameters and applies the compiled update.

``Learner`` is plain Python. Run in one process it uses the local devices; run by the
engine as one Ray actor per chip, after ``jax.distributed`` has joined all the chips of a
slice, its mesh spans the whole slice and the same update averages gradients across
every chip. The update step is written once (``workbench.algos``); only the mesh differs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from workbench.algos.ppo import LossFn, PPOConfig, Trajectory, ppo_loss
from workbench.compile_cache import cache_root, load_or_compile
from workbench.rollout import RolloutBatch

AXIS = "chips"


class DistributedStartError(RuntimeError):
    """The learners of a slice did not form one ``jax.distributed`` group in time."""


def configure_jax_platform(platform: str) -> None:
    """Pin this process to one JAX platform before any backend exists.

    On the simulated slice every learner is a CPU process with exactly one device (its
    "chip") and gloo collectives; on a TPU host the platform is ``tpu``.
    """
    import jax

    jax.config.update("jax_platforms", platform)
    # Every learner compiles the same update; a persistent cache lets later runs (and
    # restarted learners) skip the compile. Process 0 uses JAX's; the other ranks of a
    # slice also keep theirs through workbench.compile_cache.
    jax.config.update("jax_compilation_cache_dir", cache_root())
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    if platform == "cpu":
        jax.config.update("jax_num_cpu_devices", 1)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")


def join_distributed(coordinator: str, num_processes: int, rank: int, timeout_s: float) -> float:
    """Join the slice's ``jax.distributed`` group; returns the seconds it took."""
    import jax

    started = time.monotonic()
    if num_processes > 1:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            # Listen where the learners reach it (loopback on the simulated slice), not on
            # every interface, which is JAX's default.
            coordinator_bind_address=coordinator,
            num_processes=num_processes,
            process_id=rank,
            initialization_timeout=max(1, int(timeout_s)),
            # A chip that stops answering aborts the group in seconds instead of minutes.
            heartbeat_timeout_seconds=10,
        )
    return time.monotonic() - started


def to_numpy(tree):
    """A host copy of a (replicated) pytree of arrays, read from this process's devices."""
    import jax

    def host(x):
        return np.asarray(x.addressable_data(0) if hasattr(x, "addressable_data") else x)

    return jax.tree.map(host, tree)


@dataclass(frozen=True)
class UpdateResult:
    metrics: dict[str, float]
    stop: bool
    step_s: float
    episode_returns: tuple[float, ...] = ()
    """Returns of the episodes this chip's envs finished (Anakin mode only)."""


class MeshLearner:
    """What every learner of a slice shares: a mesh over all chips, a learner state
    replicated on it, and moving that state to and from the host."""

    def __init__(self, seed: int) -> None:
        import jax
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        self.seed = seed
        self.mesh = Mesh(np.array(jax.devices()), (AXIS,))
        self.num_chips = self.mesh.size
        self._replicated = NamedSharding(self.mesh, P())
        self._per_env = NamedSharding(self.mesh, P(None, AXIS))
        self._per_chip = NamedSharding(self.mesh, P(AXIS))
        self.state = None
        # Kept on the host too, so the per-update key needs no device read.
        self._updates = 0

    def _setup_ppo(
        self,
        obs_example: np.ndarray,
        num_actions: int,
        config: PPOConfig,
        num_updates: int,
        loss_fn: LossFn,
        gather_batch: bool,
    ):
        """Build the network, the optimizer and the replicated initial state; return
        ``chip_update(state, trajectory, key, stop) -> (state, metrics, any_stop)``, the
        PPO update as run inside the mesh."""
        import jax

        from workbench.algos.ppo import ActorCritic, init_state, make_optimizer, make_update

        self.config = config
        self.network = ActorCritic(num_actions, tuple(config.hidden_sizes))
        optimizer = make_optimizer(config, num_updates)
        update = make_update(
            self.network, optimizer, config, loss_fn, axis_name=AXIS, gather_batch=gather_batch
        )
        make_state = jax.jit(
            lambda seed: init_state(self.network, optimizer, obs_example, seed),
            out_shardings=self._replicated,
        )
        # Initialising an orthogonal network compiles for seconds: cached like the update,
        # and the seed is an argument so that every seed shares one program.
        seed = self._replicate(np.asarray(self.seed, np.int32))
        self.state = load_or_compile(make_state.lower(seed))(seed)

        def chip_update(state, trajectory, key, stop):
            if not gather_batch:
                # Each chip shuffles its own data, so each needs its own key.
                key = jax.random.fold_in(key, jax.lax.axis_index(AXIS))
            state, metrics = update(state, trajectory, key, stop[0])
            # NOTE: every chip leaves the loop after the same update: the stop flags were
            # agreed on inside the update's own collectives.
            return state, metrics, metrics.pop("stop") > 0

        return chip_update

    @property
    def update_count(self) -> int:
        return self._updates

    def params_numpy(self):
        return to_numpy(self.state.params)

    def state_leaves(self) -> list[np.ndarray]:
        """Parameters and optimizer state as an ordered list of numpy arrays."""
        import jax

        return jax.tree.leaves(to_numpy((self.state.params, self.state.opt_state)))

    def load_state_leaves(self, leaves: Sequence[np.ndarray], update: int) -> None:
        """Put what :meth:`state_leaves` returned back onto the mesh, at ``update``."""
        import jax

        template = self.state
        structure = jax.tree.structure((template.params, template.opt_state))
        if structure.num_leaves != len(leaves):
            raise ValueError(
                f"the checkpoint holds {len(leaves)} arrays but this learner's network and "
                f"optimizer have {structure.num_leaves}: was it written with another network?"
            )
        params, opt_state = jax.tree.unflatten(structure, list(leaves))
        restored = type(template)(params, opt_state, np.asarray(update, np.int32))
        self.state = jax.tree.map(self._replicate, restored)
        self._updates = int(update)

    def _replicate(self, value) -> object:
        import jax

        return jax.make_array_from_process_local_data(self._replicated, np.asarray(value))

    def _update_key(self):
        """The same key on every chip for this update (seed and update count only)."""
        import jax

        return self._replicate(
            np.asarray(jax.random.key_data(
                jax.random.fold_in(jax.random.PRNGKey(self.seed), self._updates)
            ))
        )

    def _stop_flag(self, stop: bool):
        import jax

        return jax.make_array_from_process_local_data(
            self._per_chip, np.asarray([int(stop)], np.int32)
        )


class Learner(MeshLearner):
    """One chip's share of PPO learning from rollout actors' batches."""

    def __init__(
        self,
        obs_example: np.ndarray,
        num_actions: int,
        config: PPOConfig,
        num_updates: int,
        seed: int,
        loss_fn: LossFn = ppo_loss,
        gather_batch: bool = False,
    ) -> None:
        import jax
        from jax.sharding import PartitionSpec as P

        super().__init__(seed)
        update = self._setup_ppo(
            obs_example, num_actions, config, num_updates, loss_fn, gather_batch
        )

        trajectory_specs = Trajectory(*([P(None, AXIS)] * 8), last_value=P(AXIS))
        self._update = jax.jit(
            jax.shard_map(
                update,
                mesh=self.mesh,
                in_specs=(P(), trajectory_specs, P(), P(AXIS)),
                out_specs=(P(), P(), P()),
                # NOTE: JAX cannot prove that steps over a gathered batch leave every chip
                # equal, so the static check is off in that mode; the tests compare every
                # chip's state digest instead.
                check_vma=not gather_batch,
            ),
            donate_argnums=(0,),
        )
        self._compiled = None

    def update(self, batches: Sequence[RolloutBatch], stop: bool = False) -> UpdateResult:
        """Apply one update with this chip's rollouts; all chips must call it together."""
        import jax

        started = time.perf_counter()
        trajectory = Trajectory(
            obs=np.concatenate([b.obs for b in batches], axis=1),
            actions=np.concatenate([b.actions for b in batches], axis=1),
            log_probs=np.concatenate([b.log_probs for b in batches], axis=1),
            values=np.concatenate([b.values for b in batches], axis=1),
            rewards=np.concatenate([b.rewards for b in batches], axis=1),
            terminated=np.concatenate([b.terminated for b in batches], axis=1),
            truncated=np.concatenate([b.truncated for b in batches], axis=1),
            valid=np.concatenate([b.valid for b in batches], axis=1),
            last_value=np.concatenate([b.last_value for b in batches], axis=0),
        )
        global_trajectory = Trajectory(
            *[jax.make_array_from_process_local_data(self._per_env, x) for x in trajectory[:8]],
            last_value=jax.make_array_from_process_local_data(
                self._per_chip, trajectory.last_value
            ),
        )
        args = (self.state, global_trajectory, self._update_key(), self._stop_flag(stop))
        if self._compiled is None:
            self._compiled = load_or_compile(self._update.lower(*args))
        self.state, metrics, any_stop = self._compiled(*args)
        self._updates += 1
        metrics = {k: float(v) for k, v in to_numpy(metrics).items()}
        return UpdateResult(metrics, bool(to_numpy(any_stop)), time.perf_counter() - started)


def tpu_process_environment(
    topology: str, rank: int, process_addresses: Sequence[str], port: int
) -> dict[str, str]:
    """Variables that let libtpu run one process per chip across a slice.

    JAX's multi-process guide describes running several processes on one TPU host by
    giving each its own chip (``TPU_VISIBLE_CHIPS``, which Ray sets per bundle), bounds of
    one chip per process, the grid of processes over the whole slice, and every process's
    address. Only used on real TPU hosts; the simulated slice runs JAX on the CPU.

    Args:
        topology: the slice topology, ``AxB`` or ``AxBxC``.
        rank: this process's index (its chip's rank in the slice).
        process_addresses: ``host:port`` of every chip's process, in rank order.
        port: this process's own port (its entry in ``process_addresses``).
    """
    dims = [int(d) for d in topology.split("x")]
    bounds = dims + [1] * (3 - len(dims))
    if len(process_addresses) != int(np.prod(bounds)):
        raise ValueError(
            f"a {topology} slice has {int(np.prod(bounds))} chips, but "
            f"{len(process_addresses)} process addresses were given"
        )
    return {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": ",".join(str(b) for b in bounds),
        "TPU_PROCESS_ADDRESSES": ",".join(process_addresses),
        "TPU_PROCESS_PORT": str(port),
        "CLOUD_TPU_TASK_ID": str(rank),
    }


def current_platform() -> str:
    """The JAX platform this process should use: the host's ``JAX_PLATFORMS`` if set
    (the simulated hosts set ``cpu``), else ``tpu`` on a host with TPU devices."""
    configured = os.environ.get("JAX_PLATFORMS", "")
    if configured:
        return configured.split(",")[0]
    return "tpu" if os.path.exists("/dev/accel0") or os.path.isdir("/dev/vfio") else "cpu"
