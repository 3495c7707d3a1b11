"""One actor per chip of a reserved slice, joined into one ``jax.distributed`` group: what
a run's learners and a sweep's programs both start from."""

from __future__ import annotations

from workbench.engine.cluster_state import remote
from workbench.learn.platform import DistributedStartError
from workbench.tpu.process_env import ProcessLayoutError


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


def issue_joins(actors: list, shape, timeout_s: float) -> list:
    """Ask every chip's actor to join one group of the slice's ``shape``; returns the
    calls' refs.

    Every actor first describes its process (``describe_process()``: its host, its chip,
    its ports); each join gets all of them and works out, with the same pure function,
    its own TPU environment, its process index and the coordinator's address (see
    :func:`workbench.tpu.process_env.chip_layout`). The descriptions go to the joins as
    references, so nothing here waits.
    """
    processes = [actor.describe_process.remote() for actor in actors]
    return [actor.join.remote(shape, timeout_s, *processes) for actor in actors]


def wait_for_joins(joins: list, timeout_s: float, slice_label: str) -> list:
    """Wait for the joins :func:`issue_joins` asked for, and check that every learner sees
    one mesh of the slice's chips; returns their :class:`~workbench.engine.actors.JoinReport`.

    Raises:
        As :func:`collect_joins`, and MeshMismatchError: they joined, but some rank sees
        another mesh; names what each rank saw.
    """
    from workbench.learn.joined_mesh import check_views

    reports = collect_joins(joins, timeout_s)
    check_views([report.mesh for report in reports], slice_label)
    return reports


def collect_joins(joins: list, timeout_s: float) -> list:
    """Every join's :class:`~workbench.engine.actors.JoinReport`, unchecked (``workbench
    doctor --mesh`` shows a wrong mesh instead of refusing it).

    Raises:
        DistributedStartError: naming the ranks that did not join in time.
        ProcessLayoutError: the processes do not make one slice (a chip missing or given
            twice, a port clash), said once.
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
    try:
        reports = ray.get(joins)
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, ProcessLayoutError):
            raise error.cause from None
        raise
    return reports
