"""The JAX process of one chip: which platform it runs on, and joining the slice's
``jax.distributed`` group. Called first thing in every learner process."""

from __future__ import annotations

import os
import time

from workbench.learn.compile_cache import cache_root


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
    # slice also keep theirs through workbench.learn.compile_cache.
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



def current_platform() -> str:
    """The JAX platform this process should use: the host's ``JAX_PLATFORMS`` if set
    (the simulated hosts set ``cpu``), else ``tpu`` on a host with TPU devices."""
    configured = os.environ.get("JAX_PLATFORMS", "")
    if configured:
        return configured.split(",")[0]
    return "tpu" if os.path.exists("/dev/accel0") or os.path.isdir("/dev/vfio") else "cpu"
