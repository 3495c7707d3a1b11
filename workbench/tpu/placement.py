"""Starting work pinned to the chips of a reserved slice (the per-process TPU environment
is :mod:`workbench.tpu.process_env`)."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.tpu.slice import Slice


@dataclass(frozen=True)
class ChipReport:
    """What a process pinned to one chip sees of its placement."""

    rank: int
    host: int
    node_id: str
    visible_chips: str | None
    tpu_worker_id: str | None
    tpu_name: str | None


def _report(rank: int) -> ChipReport:
    import os

    import ray

    return ChipReport(
        rank=rank,
        host=int(os.environ.get("TPU_WORKER_ID", "-1")),
        node_id=ray.get_runtime_context().get_node_id(),
        visible_chips=os.environ.get("TPU_VISIBLE_CHIPS"),
        tpu_worker_id=os.environ.get("TPU_WORKER_ID"),
        tpu_name=os.environ.get("TPU_NAME"),
    )


def probe_chips(tpu_slice: Slice, timeout_s: float = 120.0) -> list[ChipReport]:
    """Run one task in every chip's bundle and report what each one sees."""
    import ray

    task = ray.remote(_report)
    refs = [
        task.options(
            num_cpus=tpu_slice.cpus_per_chip,
            resources={"TPU": 1},
            scheduling_strategy=tpu_slice.scheduling(chip.rank),
        ).remote(chip.rank)
        for chip in tpu_slice.chips
    ]
    return ray.get(refs, timeout=timeout_s)
