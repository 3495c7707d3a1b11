"""Reserving a whole TPU slice, and seeing which slices a cluster has.

This is the only module that imports ``ray.util.tpu``: Ray's TPU API is alpha and moves
between releases, so it is wrapped once, here, in the same shape.
"""

from __future__ import annotations

import atexit
import logging
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from workbench.tpu.catalog import SliceShape, parse_shape, shape_from_pod_type

log = logging.getLogger(__name__)

SLICE_NAME_LABEL = "ray.io/tpu-slice-name"
WORKER_ID_LABEL = "ray.io/tpu-worker-id"
POD_TYPE_LABEL = "ray.io/tpu-pod-type"
TOPOLOGY_LABEL = "ray.io/tpu-topology"


class SliceUnavailableError(RuntimeError):
    """No intact, free slice of the asked shape could be reserved in time."""


@dataclass(frozen=True)
class SliceInfo:
    """One TPU slice as the cluster sees it now."""

    name: str
    shape: SliceShape
    hosts_alive: int
    chips_alive: int
    chips_free: int

    @property
    def intact(self) -> bool:
        return self.hosts_alive == self.shape.hosts and self.chips_alive == self.shape.chips

    @property
    def free(self) -> bool:
        return self.intact and self.chips_free == self.shape.chips

    def summary(self) -> str:
        state = "free" if self.free else ("in use" if self.intact else "broken")
        return (
            f"{self.name} ({self.shape.label}, {self.shape.pod_type}, "
            f"{self.hosts_alive}/{self.shape.hosts} hosts, {state})"
        )


def _free_resources_per_node() -> dict:
    """Free resources of every node. Through Ray Client (a JupyterHub notebook) the
    GCS is not reachable from here, so the lookup runs as a task in the cluster."""
    from ray._private.client_mode_hook import client_mode_wrap
    from ray._private.state import available_resources_per_node

    return client_mode_wrap(available_resources_per_node)()


def list_slices() -> list[SliceInfo]:
    """Every TPU slice the connected cluster has, found through its nodes' labels."""
    import ray

    available = _free_resources_per_node()
    groups: dict[str, list[dict]] = {}
    for node in ray.nodes():
        labels = node.get("Labels") or {}
        if not node.get("Alive") or POD_TYPE_LABEL not in labels:
            continue
        # Single-host slices may carry no slice name; the node is the slice.
        key = labels.get(SLICE_NAME_LABEL) or node["NodeID"]
        groups.setdefault(key, []).append(node)
    found = []
    for name, nodes in groups.items():
        labels = nodes[0]["Labels"]
        shape = shape_from_pod_type(labels[POD_TYPE_LABEL], labels.get(TOPOLOGY_LABEL, ""))
        if shape is None:
            continue
        chips = sum(int(n["Resources"].get("TPU", 0)) for n in nodes)
        free = sum(int(available.get(n["NodeID"], {}).get("TPU", 0)) for n in nodes)
        found.append(SliceInfo(name, shape, len(nodes), chips, free))
    return sorted(found, key=lambda s: (s.shape.generation.name, s.shape.chips, s.name))


def _wait_until_given_back(group_id: str, timeout_s: float = 10.0) -> None:
    """Until no node holds resources of the removed placement group (Ray names them
    ``<resource>_group_<id>``). Ray removes a group in the background, so without this a
    ``list_slices()`` or a reservation right after a release could still see the slice
    in use."""
    suffix = f"_group_{group_id}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        held = [name for resources in _free_resources_per_node().values()
                for name in resources if name.endswith(suffix)]
        if not held:
            return
        time.sleep(0.05)
    log.warning("the slice's chips were not all given back %.0f s after its release",
                timeout_s)


@dataclass(frozen=True)
class Chip:
    """One chip of a reserved slice: a bundle of the placement group."""

    rank: int
    """Position in the slice, host by host; the JAX process index of its learner."""
    host: int
    """TPU worker id of the host the chip sits on."""
    node_id: str
    bundle_index: int


@dataclass(frozen=True)
class Host:
    worker_id: int
    node_id: str
    chips: tuple[int, ...]
    """Ranks of this host's chips."""


class Slice:
    """A reserved TPU slice: one placement-group bundle per chip, all on one slice.

    Use as a context manager, or call :meth:`release`; release is idempotent and also
    happens at interpreter exit. Ray removes the placement group by itself if the driver
    (notebook kernel) dies, since it shares the driver's fate.
    """

    def __init__(self, shape: SliceShape, handle, cpus_per_chip: float,
                 keep_learners: bool = False) -> None:
        self.shape = shape
        self.cpus_per_chip = cpus_per_chip
        self.keep_learners = keep_learners
        """Whether runs may keep their learner processes on the slice between runs."""
        self._handle = handle
        self._release_hooks: dict[str, Callable[[], None]] = {}
        self._released = False
        self._finalizer = weakref.finalize(self, handle.shutdown)
        _held.add(self)

    def on_release(self, name: str, hook: Callable[[], None]) -> None:
        """Call ``hook`` once when this reservation is given back (released, or replaced by
        :meth:`recover`); a later hook of the same ``name`` replaces an earlier one. Used
        by the layers above to stop what they keep on the slice."""
        self._release_hooks[name] = hook

    def _run_release_hooks(self) -> None:
        hooks, self._release_hooks = self._release_hooks, {}
        for name, hook in hooks.items():
            try:
                hook()
            except Exception:  # the rest of the release must still happen
                log.warning("stopping the slice's %s failed", name, exc_info=True)

    @property
    def placement_group(self):
        return self._handle.placement_group

    @property
    def released(self) -> bool:
        return self._released

    @cached_property
    def chips(self) -> tuple[Chip, ...]:
        import ray
        from ray.util import placement_group_table

        table = placement_group_table(self.placement_group)
        node_labels = {n["NodeID"]: n.get("Labels") or {} for n in ray.nodes()}
        placed = []
        for bundle_index, node_id in table["bundles_to_node_id"].items():
            worker = int(node_labels.get(node_id, {}).get(WORKER_ID_LABEL, 0))
            placed.append((worker, int(bundle_index), node_id))
        placed.sort()
        return tuple(
            Chip(rank=r, host=w, node_id=n, bundle_index=b) for r, (w, b, n) in enumerate(placed)
        )

    @cached_property
    def hosts(self) -> tuple[Host, ...]:
        by_worker: dict[int, list[Chip]] = {}
        for chip in self.chips:
            by_worker.setdefault(chip.host, []).append(chip)
        return tuple(
            Host(worker_id=w, node_id=chips[0].node_id, chips=tuple(c.rank for c in chips))
            for w, chips in sorted(by_worker.items())
        )

    @property
    def num_chips(self) -> int:
        return self.shape.chips

    @property
    def num_hosts(self) -> int:
        return self.shape.hosts

    @cached_property
    def name(self) -> str:
        """The slice's name (``ray.io/tpu-slice-name`` of its hosts)."""
        import ray

        node_id = self.chips[0].node_id
        for node in ray.nodes():
            if node["NodeID"] == node_id:
                return (node.get("Labels") or {}).get(SLICE_NAME_LABEL, node_id)
        return node_id

    def scheduling(self, rank: int):
        """The scheduling strategy that pins a task or actor to chip ``rank``'s bundle.

        Raises:
            ValueError: ``rank`` is not a chip of this slice.
        """
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.num_chips:
            raise ValueError(
                f"Chip rank {rank!r} is not in this {self.shape.label} slice: ranks are whole "
                f"numbers from 0 to {self.num_chips - 1}."
            )
        return PlacementGroupSchedulingStrategy(
            placement_group=self.placement_group,
            placement_group_bundle_index=self.chips[rank].bundle_index,
            placement_group_capture_child_tasks=True,
        )

    def recover(self, timeout_s: float = 300.0) -> None:
        """Give back what is left of this slice and hold an intact one of the same shape
        in its place: after a lost host, the run goes on with the same handle.

        Raises:
            SliceUnavailableError: no intact slice of the shape within ``timeout_s``; the
                handle is then released.
        """
        if self._released:
            raise ValueError("This slice has been released; reserve a new one instead.")
        self._give_back()
        try:
            fresh = reserve(self.shape, timeout_s=timeout_s, cpus_per_chip=self.cpus_per_chip,
                            keep_learners=self.keep_learners)
        except BaseException:
            self._released = True
            _held.discard(self)
            raise
        # Adopt the new reservation; the temporary handle must not release it.
        _held.discard(fresh)
        fresh._finalizer.detach()
        self._handle = fresh._handle
        self._finalizer = weakref.finalize(self, self._handle.shutdown)
        for cached in ("chips", "hosts", "name"):
            self.__dict__.pop(cached, None)

    def _give_back(self) -> None:
        """Stop what the layers above keep on the slice, remove its placement group, and
        return once Ray has dropped the group's resources."""
        self._run_release_hooks()
        group_id = self.placement_group.id.hex()
        self._finalizer()
        _wait_until_given_back(group_id)

    def release(self) -> None:
        """Give the slice back. Idempotent."""
        import ray

        if self._released:
            return
        self._released = True
        _held.discard(self)
        if ray.is_initialized():
            self._give_back()
        else:
            # Disconnected (or the cluster is gone): Ray already removed the placement
            # group with the driver's job; calling into Ray now would start a new instance.
            self._finalizer.detach()

    def __enter__(self) -> Slice:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def layout(self) -> str:
        lines = [f"{self.shape.label} slice {self.name}: {self.num_hosts} host(s) x "
                 f"{self.shape.chips_per_host} chip(s)"]
        for host in self.hosts:
            lines.append(f"  host {host.worker_id} ({host.node_id[:8]}): chips {list(host.chips)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"Slice({self.shape.label}, {self.num_hosts} hosts x " \
               f"{self.shape.chips_per_host} chips, {state})"


_held: weakref.WeakSet[Slice] = weakref.WeakSet()


@atexit.register
def release_all() -> None:
    """Release every slice this process holds (at exit, and when the process is told to
    terminate)."""
    for held in list(_held):
        try:
            held.release()
        except Exception:  # the cluster may already be gone at exit
            log.debug("release at exit failed", exc_info=True)


def _unavailable_message(shape: SliceShape, timeout_s: float, reason: str) -> str:
    try:
        slices = list_slices()
    except Exception:  # the message must not fail because the cluster is in trouble
        slices = []
    same = [s for s in slices if s.shape == shape]
    other = [s for s in slices if s.shape != shape]
    lines = [
        f"Could not reserve a {shape.label} slice (pod type {shape.pod_type}, "
        f"{shape.hosts} host(s) x {shape.chips_per_host} chips) within {timeout_s:g} s: {reason}."
    ]
    if same:
        lines.append("Slices of that shape now: " + "; ".join(s.summary() for s in same) + ".")
    else:
        lines.append(f"The cluster has no {shape.pod_type} slice.")
    if other:
        lines.append("Other TPU slices: " + "; ".join(s.summary() for s in other) + ".")
    free_shapes = sorted({s.shape.label for s in other if s.free})
    advice = [
        "release a slice you hold (slice.release())",
        "retry with a larger timeout_s",
    ]
    if free_shapes:
        advice.append("or reserve a shape that is free now: " + ", ".join(free_shapes))
    else:
        advice.append("or add a node pool / slice of that shape to the cluster")
    lines.append("What to do: " + ", ".join(advice) + ".")
    return " ".join(lines)


def as_shape(generation: str | SliceShape, topology: str | None) -> SliceShape:
    """A shape given as a :class:`SliceShape`, or as a generation and a topology.

    Raises:
        CatalogError: a shape the catalog does not know.
    """
    if isinstance(generation, SliceShape):
        if topology is not None:
            raise ValueError("Give a SliceShape or a generation and a topology, not both.")
        return generation
    return parse_shape(generation, topology)


def reserve(
    generation: str | SliceShape,
    topology: str | None = None,
    *,
    timeout_s: float = 60.0,
    cpus_per_chip: float = 1.0,
    keep_learners: bool | None = None,
) -> Slice:
    """Reserve a whole TPU slice: one bundle of ``{"TPU": 1, "CPU": cpus_per_chip}`` per
    chip, on all hosts of one slice, or nothing.

    Args:
        generation: ``v4``, ``v5e``, ``v5p``, ``v6e`` or ``v7x`` (aliases accepted), or a
            :class:`~workbench.tpu.catalog.SliceShape` (then no ``topology``).
        topology: a valid topology of that generation, e.g. ``4x4`` or ``2x2x1``.
        timeout_s: how long to wait for an intact, free slice.
        cpus_per_chip: host CPUs reserved with each chip, for its learner and rollout actors.
        keep_learners: let runs keep their learner processes (one per chip, holding the
            chip's ``TPU`` resource while idle) between runs on this slice, so that the
            next run skips their start-up; release stops them. ``None``: on for the
            simulated cluster, off on any other (a shared cluster's chips are not held
            idle unless asked).

    Returns:
        The reserved :class:`Slice`.

    Raises:
        CatalogError: the shape is not in the catalog (nothing is reserved).
        ValueError: a timeout or CPU count that is not a positive number.
        SliceUnavailableError: no slice could be had in time; the message lists the slices
            that exist and what to do. No placement group is left behind.
    """
    import ray
    from ray.util.tpu import slice_placement_group

    shape = as_shape(generation, topology)
    for label, value, unit in (("timeout_s", timeout_s, "seconds"),
                               ("cpus_per_chip", cpus_per_chip, "CPUs (fractions allowed)")):
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not numeric or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{label} must be a positive number of {unit}, got {value!r}.")
    if keep_learners is not None and not isinstance(keep_learners, bool):
        raise ValueError(f"keep_learners must be True, False or None (the cluster's "
                         f"default), got {keep_learners!r}.")
    if not ray.is_initialized():
        raise SliceUnavailableError(
            "Not connected to a Ray cluster: call wb.connect(address) for an existing "
            "cluster or wb.local_cluster() for the simulated one, then reserve again."
        )
    deadline = time.monotonic() + timeout_s
    bundle = {"TPU": 1, "CPU": cpus_per_chip}
    # Pin every bundle to hosts of this pod type: a single-host 2x2 must not be carved
    # out of a host that belongs to a bigger slice, and one host must hold it all.
    selector = [{POD_TYPE_LABEL: shape.pod_type}] * shape.chips
    strategy = "STRICT_PACK" if shape.single_host else "SPREAD"
    try:
        handle = slice_placement_group(
            topology=shape.topology,
            accelerator_version=shape.generation.ray_version,
            resources_per_bundle=bundle,
            chips_per_vm=shape.chips_per_host,
            strategy=strategy,
            head_reservation_timeout_s=timeout_s,
            bundle_label_selector=selector,
        )
    except TimeoutError:
        raise SliceUnavailableError(
            _unavailable_message(shape, timeout_s, "no intact slice had its head host free")
        ) from None
    remaining = max(0.0, deadline - time.monotonic())
    ready, _ = ray.wait([handle.placement_group.ready()], timeout=remaining)
    if not ready:
        handle.shutdown()
        raise SliceUnavailableError(
            _unavailable_message(shape, timeout_s, "its chips did not all become free")
        )
    # NOTE: the head placement group is kept until release, not dropped as soon as the
    # bundles are placed: while it holds the slice's head resource, no other reservation
    # can pick this slice's name and then wait on chips that will never free up.
    if keep_learners is None:
        from workbench.tpu.cluster import connection

        current = connection()
        keep_learners = current is not None and current.simulated
    return Slice(shape, handle, cpus_per_chip, keep_learners)
