"""What one learner process sees of the mesh it joined, checked against the slice.

On the simulated slice the CPU backend builds its device list from ``jax.distributed``
itself, so a mesh forms whatever the TPU variables say. On a TPU host libtpu builds it
from each process's ``TPU_*`` environment, and a wrong one gives each process a slice of
its own (jax-ml/jax#14977) while training goes on as if nothing were wrong. So every
learner starts its backend right after the join and compares what it got with what the
slice should give, on the simulator as on a real slice.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

TPU_VARIABLE_PREFIXES = ("TPU_", "CLOUD_TPU_", "ALLOW_MULTIPLE_LIBTPU_LOAD", "LIBTPU_")


@dataclass(frozen=True)
class ExpectedMesh:
    """What a learner of the slice must see once its backend has started."""

    devices: int
    """Devices across the whole group (one per chip)."""
    processes: int
    process_index: int
    """This process's place in the group (``jax.process_index()``)."""
    local_devices: int
    """Devices this process holds (1 in the ``chip`` layout)."""


@dataclass(frozen=True)
class MeshView:
    """What one learner saw after its join: the values a person compares first."""

    rank: int
    """Its bundle's rank in the slice."""
    platform: str
    devices: int
    processes: int
    process_index: int
    local_devices: int
    local_device_ids: tuple[int, ...]
    tpu_environment: tuple[tuple[str, str], ...]
    """The ``TPU_*`` variables this process ended with, sorted by name."""
    problems: tuple[str, ...] = ()
    """How it differs from the :class:`ExpectedMesh`; empty when it matches."""

    def summary(self) -> str:
        return (f"rank {self.rank}: {self.platform}, {self.devices} devices in "
                f"{self.processes} processes, process {self.process_index}, "
                f"{self.local_devices} local (ids {list(self.local_device_ids)})")


def tpu_environment(environ=os.environ) -> tuple[tuple[str, str], ...]:
    """The variables libtpu reads, as this process has them now, sorted by name."""
    return tuple(sorted((k, v) for k, v in environ.items()
                        if k.startswith(TPU_VARIABLE_PREFIXES)))


def compare(view: MeshView, expected: ExpectedMesh) -> tuple[str, ...]:
    """Each way ``view`` differs from ``expected``, as one short phrase."""
    problems = []
    for name in ("devices", "processes", "process_index", "local_devices"):
        got, want = getattr(view, name), getattr(expected, name)
        if got != want:
            problems.append(f"{name.replace('_', ' ')} {got}, expected {want}")
    return tuple(problems)


def look_at_mesh(rank: int, expected: ExpectedMesh) -> MeshView:
    """Start this process's JAX backend and report what it sees against ``expected``.

    Call right after ``jax.distributed.initialize``: the backend starts here, inside the
    join's deadline, not at the learner's first array.
    """
    import jax

    local = jax.local_devices()
    view = MeshView(
        rank=rank,
        platform=local[0].platform,
        devices=jax.device_count(),
        processes=jax.process_count(),
        process_index=jax.process_index(),
        local_devices=len(local),
        local_device_ids=tuple(int(d.id) for d in local),
        tpu_environment=tpu_environment(),
    )
    return replace(view, problems=compare(view, expected))


class MeshMismatchError(RuntimeError):
    """The learners joined, but what they see is not one mesh of the slice's chips."""


def check_views(views: list[MeshView], slice_label: str) -> None:
    """Raise one message naming what every rank saw if any rank's mesh is wrong.

    Raises:
        MeshMismatchError: at least one view has problems.
    """
    wrong = [v for v in views if v.problems]
    if not wrong:
        return
    seen = "; ".join(f"{v.summary()}: {', '.join(v.problems) or 'as expected'}"
                     for v in views)
    raise MeshMismatchError(
        f"The learners of the {slice_label} slice did not form one mesh of its chips "
        f"({len(wrong)} of {len(views)} ranks differ). Seen: {seen}. Run `workbench doctor "
        "--mesh` on this cluster to see each process's TPU environment."
    )


def check_same_state(digest: str) -> None:
    """Check that every process of the group holds the state whose SHA-256 is ``digest``
    (hex); every process must call it together, as it is a collective.

    Raises:
        MeshMismatchError: naming each process's digest, when they differ.
    """
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return
    mine = np.frombuffer(bytes.fromhex(digest), np.uint8)
    every = np.asarray(multihost_utils.process_allgather(mine))
    if (every != every[0]).any():
        seen = ", ".join(f"process {i}: {bytes(row).hex()[:12]}" for i, row in enumerate(every))
        raise MeshMismatchError(
            "The chips' states differ after the first update, so they are not one mesh "
            f"learning together ({seen}). Run `workbench doctor --mesh` on this cluster."
        )


def time_psum(axis: str = "chips") -> tuple[float, float, float]:
    """A ``psum`` over every device of the group, each process giving its index + 1 on
    each of its devices; every process must call it together.

    Returns:
        The sum, what it should be, and the seconds of its second call (the first
        compiles).
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), (axis,))
    total = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, axis), mesh=mesh,
                                  in_specs=P(axis), out_specs=P()))
    local = np.full((jax.local_device_count(),), jax.process_index() + 1, np.float32)
    values = jax.make_array_from_process_local_data(NamedSharding(mesh, P(axis)), local)
    total(values).block_until_ready()
    started = time.perf_counter()
    result = total(values).block_until_ready()
    seconds = time.perf_counter() - started
    per_process = jax.device_count() // jax.process_count()
    expected = per_process * sum(range(1, jax.process_count() + 1))
    return float(np.asarray(result.addressable_data(0)).reshape(-1)[0]), float(expected), seconds
