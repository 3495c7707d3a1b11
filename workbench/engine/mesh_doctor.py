"""``workbench doctor --mesh``: the first thing to run on a new cluster.

It reserves a slice, starts one learner process per chip exactly as a run does, and
reports what each process got: its TPU environment, its devices and process index, and a
``psum`` over every chip with its time. Nothing trains; the slice is released at the end
whatever happened.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from workbench.engine.actors import ChipLearnerActor
from workbench.engine.chip_group import collect_joins, issue_joins, start_chip_actors
from workbench.engine.cluster_state import kill_and_wait
from workbench.learn.joined_mesh import MeshView


@dataclass(frozen=True)
class PsumCheck:
    """A ``psum`` over every chip, as one learner saw it."""

    rank: int
    value: float
    expected: float
    seconds: float
    """Its second call (the first compiles)."""


@dataclass(frozen=True)
class MeshReport:
    """What :func:`check_mesh` found."""

    slice_name: str
    slice_label: str
    views: tuple[MeshView, ...]
    psums: tuple[PsumCheck, ...]
    error: str = ""
    """Why the processes did not get as far as a psum, if they did not."""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (not self.error and bool(self.views) and not any(v.problems for v in self.views)
                and all(p.value == p.expected for p in self.psums) and bool(self.psums))

    def lines(self) -> list[str]:
        """The report a person reads, a line per fact."""
        out = [f"Slice {self.slice_name} ({self.slice_label}): "
               f"{len(self.views)} learner processes"]
        for view in self.views:
            state = "ok" if not view.problems else "WRONG: " + ", ".join(view.problems)
            out.append(f"  {view.summary()} [{state}]")
            for name, value in view.tpu_environment:
                out.append(f"      {name}={value}")
        for psum in self.psums:
            state = "ok" if psum.value == psum.expected else "WRONG"
            out.append(f"  rank {psum.rank}: psum over every chip = {psum.value:g} (expected "
                       f"{psum.expected:g}) in {psum.seconds * 1e3:.2f} ms [{state}]")
        if self.error:
            out.append(f"  {self.error}")
        out.append(("The learners form one mesh of the slice's chips." if self.ok else
                    "The learners do NOT form one mesh of the slice's chips.")
                   + f" ({self.seconds:.1f} s)")
        return out


def check_mesh(generation: str, topology: str, timeout_s: float = 120.0,
               reserve_timeout_s: float = 60.0) -> MeshReport:
    """Reserve a ``generation`` ``topology`` slice, join a learner per chip and check the
    mesh they form; the slice is released before this returns.

    Raises:
        CatalogError: the shape is not in the catalog.
        SliceUnavailableError: no such slice could be reserved.
    """
    import ray

    from workbench.tpu.slice import reserve

    started = time.monotonic()
    tpu_slice = reserve(generation, topology, timeout_s=reserve_timeout_s, keep_learners=False)
    actors: list = []
    views: tuple[MeshView, ...] = ()
    psums: tuple[PsumCheck, ...] = ()
    error = ""
    try:
        actors = start_chip_actors(tpu_slice, ChipLearnerActor, f"{tpu_slice.name}:doctor")
        joins = issue_joins(actors, tpu_slice.shape, timeout_s)
        views = tuple(report.mesh for report in collect_joins(joins, timeout_s))
        if not any(view.problems for view in views):
            psums = tuple(PsumCheck(rank, *answer) for rank, answer in enumerate(
                ray.get([a.time_psum.remote() for a in actors], timeout=timeout_s)))
    except Exception as failure:  # reported, not raised: the report is the answer
        cause = getattr(failure, "cause", None) or failure
        error = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
    finally:
        kill_and_wait(actors)
        tpu_slice.release()
    return MeshReport(tpu_slice.name, tpu_slice.shape.label, views, psums, error,
                      time.monotonic() - started)
