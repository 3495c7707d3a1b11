"""Starting work pinned to the chips of a reserved slice, and the per-process TPU
environment for one process per chip."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from workbench.tpu.catalog import SliceShape
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


def tpu_process_environment(
    shape: SliceShape, rank: int, process_addresses: Sequence[str], port: int
) -> dict[str, str]:
    """Variables that let libtpu run one process per chip across a slice.

    JAX's multi-process guide describes running several processes on one TPU host by
    giving each its own chip (``TPU_VISIBLE_CHIPS``, which Ray sets per bundle), bounds of
    one chip per process, the grid of processes over the whole slice, and every process's
    address. Only used on real TPU hosts; the simulated slice runs JAX on the CPU.

    Args:
        shape: the slice's shape.
        rank: this process's index (its chip's rank in the slice).
        process_addresses: ``host:port`` of every chip's process, in rank order.
        port: this process's own port (its entry in ``process_addresses``).

    Raises:
        ValueError: not one address per chip.
    """
    dims = [int(d) for d in shape.topology.split("x")]
    bounds = dims + [1] * (3 - len(dims))
    if len(process_addresses) != math.prod(bounds):
        raise ValueError(
            f"a {shape.label} slice has {math.prod(bounds)} chips, but "
            f"{len(process_addresses)} process addresses were given"
        )
    return {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": ",".join(str(b) for b in bounds),
        "TPU_PROCESS_ADDRESSES": ",".join(process_addresses),
        "TPU_PROCESS_PORT": str(port),
        "CLOUD_TPU_TASK_ID": str(rank),
    }
