"""The environment each chip's learner process needs so that one JAX process per chip
forms a single multi-process TPU slice.

Pure functions of the slice shape and of what each process reports about itself (its
host, its chip, its address and the ports it picked); nothing here imports Ray or JAX.
On TPU, ``jax.distributed.initialize`` hands libtpu only a key-value store, and libtpu
builds the device topology from the variables computed here, so they must be in each
process's environment before JAX starts its backend.

Sources (public repositories), cited by file next to each fact below:

- jax-ml/jax ``jax/_src/test_multiprocess.py``: JAX's own harness that starts one
  process per chip; ``conftest.py`` at the repository root does the same for xdist.
- pytorch/xla ``torch_xla/_internal/tpu.py`` (``configure_topology``,
  ``build_tpu_env_from_vars``) and its tests ``test/pjrt/test_internal_tpu.py``.
- ray-project/ray ``python/ray/_private/accelerators/tpu.py``
  (``set_current_process_visible_accelerator_ids``), checked in the installed Ray 2.60.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from workbench.tpu.catalog import CHIPS_PER_MULTI_HOST, SliceShape

Bounds = tuple[int, int, int]

VISIBLE_CHIPS = "TPU_VISIBLE_CHIPS"
CHIPS_PER_PROCESS_BOUNDS = "TPU_CHIPS_PER_PROCESS_BOUNDS"
PROCESS_BOUNDS = "TPU_PROCESS_BOUNDS"
PROCESS_ADDRESSES = "TPU_PROCESS_ADDRESSES"
PROCESS_PORT = "TPU_PROCESS_PORT"
TASK_ID = "CLOUD_TPU_TASK_ID"
ALLOW_MULTIPLE_LIBTPU_LOAD = "ALLOW_MULTIPLE_LIBTPU_LOAD"
# The older names of the two bounds variables. Ray writes them for a one- or two-chip
# allocation (1,1,1 / 1,2,1 and a single-host 1,1,1: ray _private/accelerators/tpu.py,
# set_current_process_visible_accelerator_ids), i.e. "this process is a whole slice of
# one chip", which contradicts the slice-wide bounds set here.
OLD_CHIPS_PER_HOST_BOUNDS = "TPU_CHIPS_PER_HOST_BOUNDS"
OLD_HOST_BOUNDS = "TPU_HOST_BOUNDS"
NOSET_VISIBLE_CHIPS = "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS"

# libtpu listens here when TPU_PROCESS_PORT is unset; two processes on one host that both
# fall back to it collide (ray-project/ray#66029, whose subslice code also starts at 8471).
LIBTPU_DEFAULT_PORT = 8471

_ONE_CHIP: Bounds = (1, 1, 1)

# Chip bounds of one host that carries a whole single-host slice, by generation and chip
# count. The 8-chip boards differ although GKE labels both "2x4": JAX's harness
# (jax/_src/test_multiprocess.py) gives 8 chips at one per process TPU_PROCESS_BOUNDS
# 4,2,1, and notes that its 4-chips-per-process branch (process bounds 1,2,1 times chips
# 2,2,1) fits the 2x4 v6e board but not the 4x2 v5e board; its 8-chips-per-process branch
# uses chips-per-host bounds 2,4,1 (v6e). Not yet seen on a v5e-8: Ray's open subslice
# code (ray-project/ray#66029) writes 2,4,1 for any 8-chip host, and libtpu's compile-only
# "v5e:2x4" topology refuses 4x2x1 hosts, so a v5e-8 run is the check to make.
_SINGLE_HOST_CHIP_BOUNDS: dict[tuple[str, int], Bounds] = {
    # A one-chip host: JAX's harness and pytorch/xla's configure_one_chip_topology.
    ("v5e", 1): (1, 1, 1),
    ("v6e", 1): (1, 1, 1),
    # Four chips on one host are a 2x2 tray: JAX's harness (4 chips at one per process:
    # process bounds 2,2,1); pytorch/xla test_internal_tpu.py, v4-8 chips-per-process 2,2,1.
    ("v4", 4): (2, 2, 1),
    ("v5p", 4): (2, 2, 1),
    ("v5e", 4): (2, 2, 1),
    ("v6e", 4): (2, 2, 1),
    ("v6e", 8): (2, 4, 1),
    ("v5e", 8): (4, 2, 1),
}
# Every host of a multi-host slice holds a 2x2 tray of four chips: pytorch/xla
# test_internal_tpu.py (v4-16: chips-per-process 2,2,1, process bounds 1,1,2), and
# libtpu's own compile-only topologies (v5e/v6e 4x4, v5p 2x2x2) split hosts 2x2x1.
_MULTI_HOST_CHIP_BOUNDS: Bounds = (2, 2, 1)
_SUPPORTED = ("v4", "v5e", "v5p", "v6e")


class ProcessLayoutError(ValueError):
    """The processes reported for a slice cannot form one process per chip."""


class _FrozenEnvironment(Mapping[str, str]):
    """A read-only, hashable, picklable mapping of variable names to values (a
    ``MappingProxyType`` cannot be pickled, and layouts travel to Ray actors)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str]) -> None:
        self._items = dict(items)

    def __getitem__(self, name: str) -> str:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return repr(self._items)


@dataclass(frozen=True)
class ChipProcess:
    """What one chip's learner process reports before JAX starts its backend."""

    rank: int
    """Its bundle's rank in the reserved slice (the workbench's numbering, 0..chips-1)."""
    worker_id: int
    """``TPU_WORKER_ID`` of its host (0..hosts-1)."""
    address: str
    """Its host's IP address, as the other hosts reach it."""
    environment: Mapping[str, str]
    """The ``TPU_*`` variables in its process environment now (what GKE and Ray set)."""
    tpu_port: int
    """A free port on its host that it chose for libtpu (``TPU_PROCESS_PORT``)."""
    coordinator_port: int
    """A free port on its host for ``jax.distributed``'s coordinator (used only by the
    process that gets process_id 0)."""


@dataclass(frozen=True)
class ProcessEnvironment:
    """The changes one chip's process makes to its environment before JAX starts."""

    rank: int
    """The same bundle rank as its :class:`ChipProcess`."""
    process_id: int
    """``CLOUD_TPU_TASK_ID``, and the ``process_id`` to pass to
    ``jax.distributed.initialize``."""
    set: Mapping[str, str]
    """Variables to set."""
    remove: tuple[str, ...]
    """Variables to remove."""

    def __post_init__(self) -> None:
        # Whatever mapping a caller passes, keep a private read-only copy.
        object.__setattr__(self, "set", _FrozenEnvironment(self.set))
        object.__setattr__(self, "remove", tuple(self.remove))

    def apply(self, environ: MutableMapping[str, str]) -> None:
        """Remove, then set, the variables in ``environ`` (e.g. ``os.environ``).

        Args:
            environ: the environment to change in place.
        """
        for name in self.remove:
            environ.pop(name, None)
        environ.update(self.set)


@dataclass(frozen=True)
class MeshLayout:
    """Every chip's process environment for one slice, and where its coordinator is."""

    coordinator: str
    """``host:port`` of process_id 0 (its address and its coordinator_port)."""
    processes: tuple[ProcessEnvironment, ...]
    """Indexed by bundle rank."""

    @property
    def num_processes(self) -> int:
        """The ``num_processes`` to pass to ``jax.distributed.initialize``."""
        return len(self.processes)

    def for_rank(self, rank: int) -> ProcessEnvironment:
        """The environment of the process in bundle ``rank``.

        Args:
            rank: a bundle rank, 0..chips-1.

        Returns:
            That rank's :class:`ProcessEnvironment`.

        Raises:
            ProcessLayoutError: ``rank`` is not a rank of this slice.
        """
        if not isinstance(rank, int) or not 0 <= rank < len(self.processes):
            raise ProcessLayoutError(
                f"Rank {rank!r} is not in this layout: valid ranks are 0 to "
                f"{len(self.processes) - 1}; pass the rank of the chip's bundle."
            )
        return self.processes[rank]


def _csv(bounds: Iterable[int]) -> str:
    return ",".join(str(b) for b in bounds)


def _refuse_unsupported(shape: SliceShape) -> None:
    name = shape.generation.name
    if name == "v7x":
        # A v7x chip carries two devices and libtpu wants four-dimensional process bounds
        # (pytorch/xla configure_topology appends ",2"; ray-project/ray#65221, #65723).
        raise ProcessLayoutError(
            f"One process per chip is not supported yet for {shape.label}: a v7x chip holds "
            f"two devices and needs four-dimensional process bounds. Supported generations: "
            f"{', '.join(_SUPPORTED)}; for v7x use the host layout (one process per host "
            f"holding all {shape.chips_per_host} of its chips)."
        )
    if name not in _SUPPORTED:
        raise ProcessLayoutError(
            f"No per-chip process layout is known for {shape.label}. Supported generations: "
            f"{', '.join(_SUPPORTED)}; use the host layout (one process per host) instead."
        )


def host_chip_bounds(shape: SliceShape) -> Bounds:
    """The chips of one host of ``shape`` along x, y and z.

    Args:
        shape: the slice's shape.

    Returns:
        ``(x, y, z)`` chip counts; their product is ``shape.chips_per_host``.

    Raises:
        ProcessLayoutError: a v7x shape (not supported yet), or a generation or host size
            with no known board layout.
    """
    _refuse_unsupported(shape)
    if shape.single_host:
        bounds = _SINGLE_HOST_CHIP_BOUNDS.get((shape.generation.name, shape.chips))
        if bounds is None:
            known = sorted(n for g, n in _SINGLE_HOST_CHIP_BOUNDS if g == shape.generation.name)
            raise ProcessLayoutError(
                f"No board layout is known for a single {shape.generation.name} host with "
                f"{shape.chips} chips ({shape.label}); known single-host sizes: "
                f"{', '.join(map(str, known))} chips. Pick a catalog topology."
            )
        return bounds
    if shape.chips_per_host != CHIPS_PER_MULTI_HOST:
        raise ProcessLayoutError(
            f"{shape.label} has {shape.chips_per_host} chips per host, but hosts of "
            f"multi-host slices carry {CHIPS_PER_MULTI_HOST}. Pick a catalog topology."
        )
    return _MULTI_HOST_CHIP_BOUNDS


def host_bounds(shape: SliceShape) -> Bounds:
    """The hosts of ``shape`` along x, y and z: the topology divided by the host's chip
    bounds, axis by axis.

    Args:
        shape: the slice's shape.

    Returns:
        ``(x, y, z)`` host counts; their product is ``shape.hosts``.

    Raises:
        ProcessLayoutError: a v7x or unknown shape (see :func:`host_chip_bounds`), or a
            topology that the host's chip bounds do not divide.
    """
    chips = host_chip_bounds(shape)
    if shape.single_host:
        # One host is the whole slice. Dividing the label would be wrong for the v5e-8
        # board: GKE calls it 2x4 while its chips lie 4x2.
        return (1, 1, 1)
    dims = [int(d) for d in shape.topology.split("x")]
    dims += [1] * (3 - len(dims))
    if len(dims) != 3 or any(d % c for d, c in zip(dims, chips, strict=True)):
        raise ProcessLayoutError(
            f"Topology {shape.topology} of {shape.label} is not a whole number of hosts of "
            f"{_csv(chips).replace(',', 'x')} chips. Pick a catalog topology."
        )
    hosts: Bounds = (dims[0] // chips[0], dims[1] // chips[1], dims[2] // chips[2])
    if math.prod(hosts) != shape.hosts:
        raise ProcessLayoutError(
            f"{shape.label} divides into {math.prod(hosts)} hosts of "
            f"{_csv(chips).replace(',', 'x')} chips, but the catalog counts {shape.hosts}."
        )
    return hosts


def _endpoint(address: str, port: int) -> str:
    # A bare IPv6 address needs brackets before ":port" to stay unambiguous.
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _visible_chip(process: ChipProcess, chips_per_host: int) -> int | None:
    """The one chip a process holds, or None on a one-chip host without a mask."""
    raw = process.environment.get(VISIBLE_CHIPS)
    where = f"rank {process.rank} (host {process.worker_id})"
    if raw is None or not raw.strip():
        if chips_per_host == 1:
            # A bundle holding a whole node gets no mask from Ray (ray
            # _private/accelerators/tpu.py pops TPU_VISIBLE_CHIPS when the allocation is
            # every chip of the node): on a one-chip host that chip is the only one.
            return None
        raise ProcessLayoutError(
            f"{where} has no {VISIBLE_CHIPS} on a host of {chips_per_host} chips, so it "
            f"would claim every chip of its host; each learner must hold {{'TPU': 1}} with "
            f"Ray setting its chip ({NOSET_VISIBLE_CHIPS} must be unset)."
        )
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if len(parts) != 1 or not parts[0].isdecimal():
        raise ProcessLayoutError(
            f"{where} has {VISIBLE_CHIPS}={raw!r}; one process per chip needs exactly one "
            f"chip id (a whole number such as '0'); give each learner {{'TPU': 1}}."
        )
    return int(parts[0])


def _check_port(process: ChipProcess, name: str, port: object) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ProcessLayoutError(
            f"rank {process.rank} reported {name}={port!r}; a port is a whole number from 1 "
            f"to 65535: pick a free port on its host."
        )


def chip_layout(shape: SliceShape, processes: Sequence[ChipProcess]) -> MeshLayout:
    """Each chip's process environment, so that one JAX process per chip forms one slice.

    Process ids run host by host (``worker_id``), and within a host by the position of
    the chip in ``TPU_VISIBLE_CHIPS`` among that host's chips, sorted: Ray gives each
    bundle whichever chip is free, so a bundle's rank says nothing about its chip.

    Args:
        shape: the reserved slice's shape.
        processes: one report per chip, in any order.

    Returns:
        The coordinator's ``host:port`` and every process's environment, by bundle rank.

    Raises:
        ProcessLayoutError: a v7x or unknown shape, or reports that are not one process on
            each chip of each host with distinct ports (the message says which).
    """
    chip_bounds = host_chip_bounds(shape)
    hosts = host_bounds(shape)
    per_host = math.prod(chip_bounds)
    n_hosts = math.prod(hosts)
    total = per_host * n_hosts

    if len(processes) != total:
        raise ProcessLayoutError(
            f"{shape.label} has {total} chips ({n_hosts} host(s) of {per_host}), but "
            f"{len(processes)} processes reported; start one learner per chip."
        )
    seen_ranks: dict[int, ChipProcess] = {}
    for process in processes:
        if not isinstance(process.rank, int) or not 0 <= process.rank < total:
            raise ProcessLayoutError(
                f"A process reported rank {process.rank!r}; valid ranks for {shape.label} "
                f"are 0..{total - 1} (its bundle's rank in the slice)."
            )
        if process.rank in seen_ranks:
            raise ProcessLayoutError(
                f"Rank {process.rank} was reported twice (hosts "
                f"{seen_ranks[process.rank].worker_id} and {process.worker_id}); each "
                f"bundle rank 0..{total - 1} must report once."
            )
        seen_ranks[process.rank] = process
        if not isinstance(process.worker_id, int) or not 0 <= process.worker_id < n_hosts:
            raise ProcessLayoutError(
                f"rank {process.rank} reported TPU_WORKER_ID {process.worker_id!r}; "
                f"{shape.label} has worker ids 0..{n_hosts - 1}: check the host's "
                f"TPU_WORKER_ID."
            )
        if not process.address or any(c in process.address for c in ", \t\n"):
            raise ProcessLayoutError(
                f"rank {process.rank} reported address {process.address!r}; give its "
                f"host's IP address as the other hosts reach it (no commas or spaces)."
            )
        _check_port(process, "tpu_port", process.tpu_port)
        _check_port(process, "coordinator_port", process.coordinator_port)
        if process.tpu_port == LIBTPU_DEFAULT_PORT:
            raise ProcessLayoutError(
                f"rank {process.rank} on host {process.worker_id} chose tpu_port "
                f"{LIBTPU_DEFAULT_PORT}, libtpu's default port, which another TPU process "
                f"on the host may hold; pick another free port."
            )

    chip_of: dict[int, int | None] = {}
    by_host: dict[int, list[tuple[int | None, ChipProcess]]] = {w: [] for w in range(n_hosts)}
    for process in processes:
        chip_of[process.rank] = _visible_chip(process, per_host)
        by_host[process.worker_id].append((chip_of[process.rank], process))
    for worker, members in by_host.items():
        if len(members) != per_host:
            ranks = sorted(p.rank for _, p in members)
            raise ProcessLayoutError(
                f"Host {worker} of {shape.label} has {len(members)} processes (ranks "
                f"{ranks}), but it has {per_host} chips; each host needs one per chip."
            )
        chips = [c for c, _ in members]
        if len(set(chips)) != len(chips):
            twice = sorted({c for c in chips if chips.count(c) > 1 and c is not None})
            raise ProcessLayoutError(
                f"Host {worker} has chip(s) {twice} in more than one process's "
                f"{VISIBLE_CHIPS}; each process must hold a different chip."
            )
        addresses = sorted({p.address for _, p in members})
        if len(addresses) != 1:
            raise ProcessLayoutError(
                f"Host {worker} reported several addresses {addresses}; all its processes "
                f"must report the same host IP address."
            )
        ports: dict[int, int] = {}
        # Any process on a host may turn out to be process 0, so no libtpu port there
        # may equal a coordinator port reported there.
        coordinator_ports = {p.coordinator_port: p.rank for _, p in members}
        for _, process in members:
            if process.tpu_port in ports:
                raise ProcessLayoutError(
                    f"Ranks {ports[process.tpu_port]} and {process.rank} on host {worker} "
                    f"both chose tpu_port {process.tpu_port}; each process on a host needs "
                    f"its own free port."
                )
            ports[process.tpu_port] = process.rank
            if process.tpu_port in coordinator_ports:
                raise ProcessLayoutError(
                    f"rank {process.rank} on host {worker} chose tpu_port "
                    f"{process.tpu_port}, the coordinator port that rank "
                    f"{coordinator_ports[process.tpu_port]} chose on the same host; pick "
                    f"different free ports for libtpu and for the coordinator."
                )

    # Task id = worker_id * chips per host + the chip's place on its host, the rule of
    # pytorch/xla configure_topology (worker_id * local_world_size + local_rank). JAX's
    # harness (single host) gives process i chip i and task id i: the same ordering.
    ordered: list[ChipProcess] = []
    for worker in range(n_hosts):
        members = by_host[worker]
        members.sort(key=lambda item: -1 if item[0] is None else item[0])
        ordered.extend(p for _, p in members)

    first = ordered[0]
    endpoints = [_endpoint(p.address, p.tpu_port) for p in ordered]
    # Ports are checked host by host only: two hosts at one address happen only on a
    # simulated slice, whose CPU backend never starts libtpu.

    # Host bounds times the host's chip bounds, axis by axis (pytorch/xla
    # configure_topology: process bounds = TPU_PROCESS_BOUNDS * TPU_CHIPS_PER_PROCESS_BOUNDS
    # of the host-per-process metadata), never the topology label.
    process_bounds = _csv(h * c for h, c in zip(hosts, chip_bounds, strict=True))
    addresses = ",".join(endpoints)
    # pytorch/xla build_tpu_env_from_vars reads TPU_PROCESS_BOUNDS and
    # TPU_CHIPS_PER_PROCESS_BOUNDS first and falls back on the old names only when the new
    # ones are unset, so the new names win there anyway; Ray's one-chip old values are
    # removed all the same so that no reader can see two contradicting slice shapes (Ray
    # itself pops them once they no longer describe the allocation).
    envs: dict[int, ProcessEnvironment] = {}
    for process_id, process in enumerate(ordered):
        chip = chip_of[process.rank]
        values = {
            CHIPS_PER_PROCESS_BOUNDS: _csv(_ONE_CHIP),
            PROCESS_BOUNDS: process_bounds,
            PROCESS_ADDRESSES: addresses,
            PROCESS_PORT: str(process.tpu_port),
            TASK_ID: str(process_id),
            # JAX's harness sets "1"; its conftest uses "true".
            ALLOW_MULTIPLE_LIBTPU_LOAD: "1",
        }
        if chip is not None:
            values[VISIBLE_CHIPS] = str(chip)
        remove = tuple(
            name for name in (OLD_CHIPS_PER_HOST_BOUNDS, OLD_HOST_BOUNDS)
            if name in process.environment
        )
        envs[process.rank] = ProcessEnvironment(process.rank, process_id, values, remove)

    return MeshLayout(
        coordinator=_endpoint(first.address, first.coordinator_port),
        processes=tuple(envs[rank] for rank in range(total)),
    )
