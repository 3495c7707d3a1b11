"""What a run asks the cluster about its actors, from any kind of driver.

A driver connected through Ray Client (``ray://``, how JupyterHub notebooks join KubeRay)
has no GCS connection of its own, so the actor table is read by a task on the cluster
there (``client_mode_wrap``), and directly otherwise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

log = logging.getLogger(__name__)

# Rollout actors and sweep boards never use a TPU: keep JAX on the CPU in their processes
# (a run's metrics board sees to its own, see MetricsBoard).
CPU_ONLY = {"env_vars": {"JAX_PLATFORMS": "cpu"}}


def remote(cls, **options):
    """``ray.remote`` of ``cls`` with ``options``, imported only when a run places actors."""
    import ray

    return ray.remote(**options)(cls) if options else ray.remote(cls)


def _actor_states(actor_ids: list[str]) -> dict[str, str]:
    from ray._private.state import actors

    table = actors()
    return {i: table.get(i, {}).get("State", "DEAD") for i in actor_ids}


def actor_states(actor_ids: list[str]) -> dict[str, str]:
    """Each actor's state (``ALIVE``, ``DEAD``, ...); an id the cluster no longer lists
    is ``DEAD``."""
    from ray._private.client_mode_hook import client_mode_wrap

    return client_mode_wrap(_actor_states)(list(actor_ids))


def wait_until_dead(actor_ids: list[str], timeout_s: float) -> bool:
    """Poll until every one of ``actor_ids`` is dead; False if ``timeout_s`` passed first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not actor_ids or all(s == "DEAD" for s in actor_states(actor_ids).values()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def kill_and_wait(handles: list, other_ids: Iterable[str] = (), timeout_s: float = 15.0) -> None:
    """Kill actors and wait (bounded) until the cluster lists them dead, so that a run that
    has returned leaves nothing alive behind it, even for a moment."""
    import ray

    for actor in handles:
        ray.kill(actor)
    ids = [actor._actor_id.hex() for actor in handles] + list(other_ids)
    if not wait_until_dead(ids, timeout_s):
        log.warning("some of the run's actors were still shutting down after %.0f s", timeout_s)


def head_node_affinity():
    """Keep run-wide helpers (metrics, evaluation) on the cluster's head, off the slice:
    a lost host must not take the run's history with it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    heads = [n["NodeID"] for n in ray.nodes()
             if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {})]
    node = heads[0] if heads else ray.get_runtime_context().get_node_id()
    # NOTE: hard affinity: Ray was seen to place a soft-affine, zero-CPU actor on a
    # TPU host now and then, and then a lost host took the board with it.
    return NodeAffinitySchedulingStrategy(node, soft=False)
