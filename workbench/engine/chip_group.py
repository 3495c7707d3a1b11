"""One actor per chip of a reserved slice, joined into one ``jax.distributed`` group: what
a run's learners and a sweep's programs both start from."""

from __future__ import annotations

from workbench.engine.cluster_state import remote
from workbench.learn.platform import DistributedStartError


def attempt_prefix(tpu_slice, attempt: int) -> str:
    """How the actors of a run's attempt on ``tpu_slice`` are named: ``<slice>:a<attempt>``,
    then ``:learner-<rank>``, ``:rollout-<i>`` (``.<n>`` after the n-th replacement of one
    of the slice's rollout actors) and ``:rollouts`` (their keeper)."""
    return f"{tpu_slice.name}:a{attempt}"


def start_chip_actors(tpu_slice, actor_class, name: str) -> list:
    """Start ``actor_class(rank, num_chips)`` in every chip's bundle, one CPU and the chip's
    ``TPU`` each, named ``<name>-<rank>`` (a person or a fault test finds them with
    ``ray.get_actor``). Does not wait for them."""
    Chip = remote(actor_class, num_cpus=1, resources={"TPU": 1}, max_concurrency=2)
    return [
        Chip.options(scheduling_strategy=tpu_slice.scheduling(chip.rank),
                     name=f"{name}-{chip.rank}").remote(chip.rank, tpu_slice.num_chips)
        for chip in tpu_slice.chips
    ]


def issue_joins(actors: list, timeout_s: float) -> list:
    """Ask every chip's actor (with ``coordinator_address()`` and ``join(coordinator,
    timeout_s)``) to join one group coordinated by rank 0; returns the calls' refs.
    Rank 0's address goes to the joins as a reference, so nothing here waits."""
    coordinator = actors[0].coordinator_address.remote()
    return [actor.join.remote(coordinator, timeout_s) for actor in actors]


def wait_for_joins(joins: list, timeout_s: float) -> None:
    """Wait for the joins :func:`issue_joins` asked for.

    Raises:
        DistributedStartError: naming the ranks that did not join in time.
    """
    import ray

    ready, _ = ray.wait(joins, num_returns=len(joins), timeout=timeout_s + 30)
    missing = [rank for rank, ref in enumerate(joins) if ref not in ready]
    if missing:
        raise DistributedStartError(
            f"Learners of ranks {missing} (of {len(joins)}) did not join their "
            f"jax.distributed group within {timeout_s:g} s. Check that their hosts are "
            "alive (wb.list_slices()) and retry, or raise distributed_timeout_s."
        )
    ray.get(joins)
