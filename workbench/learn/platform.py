"""The JAX process of one chip: which platform it runs on, and joining the slice's
``jax.distributed`` group. Called first thing in every learner process."""

from __future__ import annotations

import os
import time

from workbench.learn.compile_cache import private_cache_root


class DistributedStartError(RuntimeError):
    """The learners of a slice did not form one ``jax.distributed`` group in time."""


def configure_jax_platform(platform: str) -> None:
    """Pin this process to one JAX platform before any backend exists.

    On the simulated slice every learner is a CPU process with exactly one device (its
    "chip") and gloo collectives; on a TPU host the platform is ``tpu``.
    """
    import jax

    jax.config.update("jax_platforms", platform)
    use_compile_cache()
    if platform == "cpu":
        jax.config.update("jax_num_cpu_devices", 1)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")


def use_compile_cache() -> None:
    """Let this process keep what it compiles in JAX's persistent cache, for later runs.

    Every learner compiles the same update, and every rollout actor and evaluator its
    policy and evaluation programs: the cache lets later runs (and restarted learners) skip
    those compiles. JAX's serves a single process and process 0 of a group; the other ranks
    of a slice also keep theirs through workbench.learn.compile_cache. Only a cache folder
    nobody else can write is used: what it holds is loaded as code.
    """
    import jax

    root = private_cache_root()
    if root is not None:
        jax.config.update("jax_compilation_cache_dir", root)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def join_distributed(coordinator: str, num_processes: int, rank: int, timeout_s: float,
                     own_address: str | None = None) -> float:
    """Join the slice's ``jax.distributed`` group; returns the seconds it took.

    Args:
        coordinator: ``host:port`` of rank 0's coordinator (bound to that address only).
        num_processes: the group's size (the slice's chips).
        rank: this process's place in it.
        timeout_s: how long to wait for the whole group.
        own_address: this node's address; CPU collectives (gloo) listen there. Without it
            gloo listens on whatever this machine's hostname resolves to, which on a host
            whose name resolves to an external address is reachable from outside.
    """
    import jax

    started = time.monotonic()
    if own_address:
        bind_cpu_collectives(own_address)
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
            # Every value is given: on GKE, auto-detection would take the process id from
            # TPU_WORKER_ID, which every process of a host shares.
            cluster_detection_method="deactivate",
        )
    return time.monotonic() - started


def bind_cpu_collectives(address: str) -> None:
    """Make the CPU backend's gloo collectives listen on ``address`` only.

    NOTE: JAX builds gloo's TCP transport from the hostname unless told otherwise, and its
    config has no option for it; the CPU backend's factory is replaced (before any backend
    exists) by one that names the address. ``jax._src`` is private, so this is the one
    place the workbench reaches into it.
    """
    from jax._src import distributed, xla_bridge
    from jaxlib import _jax

    def make_cpu_client():
        collectives = None
        if distributed.global_state.client is not None:
            collectives = _jax.make_gloo_tcp_collectives(
                distributed_client=distributed.global_state.client, hostname=address
            )
        return xla_bridge.make_cpu_client(collectives=collectives)

    xla_bridge.register_backend_factory("cpu", make_cpu_client, priority=0)


def current_platform(sysfs_root: str = "/sys") -> str:
    """The JAX platform this process should use: the host's ``JAX_PLATFORMS`` if set
    (the simulated hosts set ``cpu``), else ``tpu`` on a host with TPU chips on its PCI
    bus (see :func:`workbench.learn.tpu_chips.has_tpu_chips`), else ``cpu``.

    Args:
        sysfs_root: where sysfs is mounted; tests point it at a fake tree.
    """
    from workbench.learn.tpu_chips import has_tpu_chips

    configured = os.environ.get("JAX_PLATFORMS", "")
    if configured:
        return configured.split(",")[0]
    return "tpu" if has_tpu_chips(sysfs_root) else "cpu"
