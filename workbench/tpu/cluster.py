"""Where Ray runs: an existing cluster (KubeRay on GKE, ``RAY_ADDRESS``, ``ray://``) or
an embedded simulated GKE TPU cluster on this machine.

The simulated cluster lives in its own process (:mod:`workbench.tpu.simulator`) so that the
notebook kernel's environment is never touched, and so that it stops when the kernel
goes away: it watches its stdin, which closes when its owner exits.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psutil

from workbench.tpu.catalog import SliceShape, parse_shape

log = logging.getLogger(__name__)


class ClusterError(RuntimeError):
    """The Ray cluster could not be started, reached or used."""


@dataclass(frozen=True)
class Connection:
    """What the driver is connected to."""

    address: str
    node_ip: str | None
    simulated: bool

    @property
    def on_this_machine(self) -> bool:
        """Whether the cluster's address is loopback: then all of its nodes (a simulated
        cluster's hosts too) share this machine's cores."""
        return self.simulated or _is_loopback(_split_address(self.address)[0])


_connection: Connection | None = None


def _check_reachable(host: str, port: int, timeout_s: float) -> None:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as error:
        raise ClusterError(
            f"Cannot reach a Ray cluster at {host}:{port} ({error.strerror or error}). "
            "Check the address (KubeRay serves it as <head-service>:6379, or "
            "ray://<head-service>:10001 for Ray Client), that the cluster is running, "
            "or use wb.local_cluster() for the embedded simulated slice."
        ) from None


def _split_address(address: object) -> tuple[str, int]:
    if not isinstance(address, str):
        raise ClusterError(
            f"A Ray address must be a string such as 'head:6379' or 'ray://head:10001', got "
            f"{address!r} ({type(address).__name__})."
        )
    body = address.split("://", 1)[-1]
    host, sep, port = body.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(
            f"Ray address {address!r} is not of the form host:port or ray://host:port. "
            "Pass the head service address, set RAY_ADDRESS, or use wb.local_cluster()."
        )
    return host, int(port)


def parse_address(address: object) -> tuple[str, int]:
    """Check a Ray address without connecting to it.

    Args:
        address: ``host:port`` or ``ray://host:port``.

    Returns:
        The host and the port.

    Raises:
        ClusterError: the address is not a string of that form, or the port is not 1-65535.
    """
    return _split_address(address)


def connect(
    address: str | None = None, *, node_ip: str | None = None, timeout_s: float = 10.0
) -> Connection:
    """Connect this process to a Ray cluster as a driver.

    Args:
        address: ``host:port`` of a cluster's GCS, or ``ray://host:port`` for Ray Client.
            Defaults to the ``RAY_ADDRESS`` environment variable.
        node_ip: the address this driver is known by. For a cluster bound to loopback,
            such as the simulated one, it defaults to the address's own host (then Ray
            keeps this driver, and the address, on loopback instead of swapping in the
            machine's external IP); elsewhere Ray picks it.
        timeout_s: how long to wait for the address to answer before giving up.

    Returns:
        The connection. Connecting again to the same address is a no-op.

    Raises:
        ClusterError: no address was given, it is malformed or it does not answer, or the
            process is already connected to a different cluster.
        ValueError: a timeout that is not a positive number of seconds.
    """
    global _connection
    import ray

    _check_positive("timeout_s", timeout_s, "seconds")
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ClusterError(
            "No Ray cluster address: pass address='host:port' (or 'ray://host:10001'), "
            "set RAY_ADDRESS, or start the embedded simulated cluster with "
            "wb.local_cluster()."
        )
    host, port = _split_address(address)
    if ray.is_initialized():
        if _connection is not None and _connection.address == address:
            return _connection
        raise ClusterError(
            f"This process is already connected to a Ray cluster "
            f"({_connection.address if _connection else 'started elsewhere'}); asked for "
            f"{address}. Call wb.disconnect() first."
        )
    _check_reachable(host, port, timeout_s)
    kwargs: dict = {"logging_level": logging.WARNING, "log_to_driver": False}
    client = address.startswith("ray://")
    if node_ip is None and not client and host != "localhost" and _is_loopback(host):
        # A cluster bound to loopback is on this machine and reachable only there: be
        # known by the same address (else Ray names this driver by the machine's external
        # IP, which such a cluster cannot reach, and ray.init waits for minutes).
        node_ip = host
    if node_ip:
        kwargs["_node_ip_address"] = node_ip
    local_only = _is_loopback(host) and bool(node_ip) and _is_loopback(node_ip)
    with _ray_local_only(local_only):
        ray.init(address=address, **kwargs)
    _connection = Connection(address=address, node_ip=node_ip, simulated=False)
    return _connection


def _check_positive(name: str, value: object, unit: str, whole: bool = False) -> None:
    kinds = (int,) if whole else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or not math.isfinite(value)
        or value <= 0
    ):
        kind = "whole number" if whole else "number"
        raise ValueError(f"{name} must be a positive {kind} of {unit}, got {value!r}.")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@contextlib.contextmanager
def _ray_local_only(enabled: bool):
    """Keep Ray from swapping 127.0.0.1 for this machine's external IP while it connects.

    NOTE: Ray reads its local-only switch (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``) once, at
    import, and a notebook kernel has usually imported Ray long before it connects; so the
    value is set only for the duration of ``ray.init``, and only for a cluster bound to
    loopback, where the external IP would reach nothing.
    """
    if not enabled:
        yield
        return
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


@dataclass
class ClusterSession:
    """The cluster a notebook or command runs on: one it joined, or a simulated one it
    started. ``close()`` (or leaving a ``with`` block) disconnects, or stops the simulator."""

    where: str
    """Which cluster, in words, for a notebook's output and a command's summary."""
    address: str
    simulated: LocalCluster | None = None

    def close(self) -> None:
        if self.simulated is not None:
            self.simulated.shutdown()
        else:
            disconnect()

    def __enter__(self) -> ClusterSession:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def join_or_start(
    address: str | None = None,
    slices: Sequence[tuple[str, str] | SliceShape] = (("v6e", "2x2"),),
    *,
    node_ip: str | None = None,
    timeout_s: float = 180.0,
) -> ClusterSession:
    """Join the cluster this code runs in, or start a simulated one when there is none.

    ``address``, else ``RAY_ADDRESS`` (what a KubeRay JupyterHub pod has, often
    ``ray://<cluster>-head-svc:10001``), is joined; only with neither is the simulated
    cluster started, with ``slices``.

    Args:
        address: a Ray address (``host:6379`` or ``ray://host:10001``); empty or None to
            use ``RAY_ADDRESS``.
        slices: what a simulated cluster holds.
        node_ip: the driver's own address, for a cluster bound to loopback.
        timeout_s: how long a simulated cluster may take to start.

    Raises:
        ClusterError: the address is malformed or does not answer, or the simulator did
            not start.
    """
    target = address or os.environ.get("RAY_ADDRESS")
    if target:
        connection = connect(target, node_ip=node_ip or None)
        return ClusterSession(f"the Ray cluster at {connection.address}", connection.address)
    cluster = local_cluster(slices, timeout_s=timeout_s)
    return ClusterSession(
        "a simulated cluster on this machine (no address given and RAY_ADDRESS unset)",
        cluster.address, cluster,
    )


def disconnect() -> None:
    """Disconnect the driver; placement groups it created are removed by Ray."""
    global _connection
    import ray

    if ray.is_initialized():
        ray.shutdown()
    _connection = None


def connection() -> Connection | None:
    return _connection


class LocalCluster:
    """A simulated GKE TPU cluster on this machine; see :func:`local_cluster`.

    Each simulated TPU host is a separate Ray node (raylet, object store, workers) with
    ``TPU: <chips per host>``, the slice-name resource, ``TPU-<pod type>-head`` on worker
    0, the ``ray.io/tpu-*`` labels and the ``TPU_*`` variables in its processes.
    """

    def __init__(
        self,
        slices: Sequence[tuple[str, str]],
        *,
        head_cpus: int = 2,
        cpus_per_chip: int = 4,
        object_store_mib: int = 80,
        timeout_s: float = 180.0,
    ) -> None:
        # Refuse bad input before anything starts.
        shapes = _slice_shapes(slices)
        _check_positive("cpus_per_chip", cpus_per_chip, "logical CPUs per chip", whole=True)
        _check_positive("object_store_mib", object_store_mib, "MiB", whole=True)
        _check_positive("timeout_s", timeout_s, "seconds")
        if isinstance(head_cpus, bool) or not isinstance(head_cpus, int) or head_cpus < 0:
            raise ValueError(f"head_cpus must be a whole number >= 0, got {head_cpus!r}.")
        self.temp_dir = tempfile.mkdtemp(prefix="wb-", dir=_short_temp_root())
        spec = {
            "temp_dir": self.temp_dir,
            "head_cpus": head_cpus,
            "cpus_per_chip": cpus_per_chip,
            "object_store_bytes": object_store_mib * 1024**2,
            "slices": [(s.generation.name, s.topology) for s in shapes],
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "RAY_ADDRESS"))}
        # Imported here: `python -m workbench.tpu.simulator` must not find itself imported already.
        from workbench.tpu.simulator import LOCAL_ONLY_ENV

        env.update(LOCAL_ONLY_ENV)  # every node binds to loopback only (see simulator)
        # Own session: the simulated cluster's processes never receive the kernel's
        # Ctrl-C, and stopping it can signal the whole group.
        with open(os.path.join(self.temp_dir, "simulator.log"), "w") as log_file:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "workbench.tpu.simulator", json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
                env=env,
                start_new_session=True,
            )
        self._lock = threading.Lock()
        self._closed = False
        self._finalizer = weakref.finalize(self, _stop_simulator, self._process, self.temp_dir)
        ready = self._read_reply(timeout_s)
        if not ready.get("ok"):
            # The log goes with the temp dir on shutdown: keep what it says about the failure.
            warnings = _log_warnings(os.path.join(self.temp_dir, "simulator.log"))
            self.shutdown()
            raise ClusterError(
                f"The simulated cluster failed to start: {ready.get('error')}.{warnings} "
                "On a busy machine, retry, or pass a larger timeout_s."
            )
        self.address: str = ready["address"]
        self.node_ip: str = ready["node_ip"]
        self.slice_names: list[str] = [s["slice"] for s in ready["slices"]]

    def _read_reply(self, timeout_s: float) -> dict:
        result: dict = {}

        def read() -> None:
            line = self._process.stdout.readline()
            result.update(json.loads(line) if line else {"ok": False, "error": "exited"})

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout_s)
        if reader.is_alive():
            return {"ok": False, "error": f"no answer within {timeout_s:.0f} s"}
        return result

    def _command(self, timeout_s: float = 120.0, **command) -> dict:
        with self._lock:
            if self._closed:
                raise ClusterError("The simulated cluster has been shut down.")
            self._process.stdin.write(json.dumps(command) + "\n")
            self._process.stdin.flush()
            reply = self._read_reply(timeout_s)
        if not reply.get("ok"):
            raise ClusterError(f"Simulated cluster refused {command['op']}: {reply.get('error')}")
        return reply

    def add_slice(self, generation: str | SliceShape, topology: str | None = None) -> str:
        """Add the hosts of one more slice; returns the new slice's name."""
        shape = generation if isinstance(generation, SliceShape) else \
            parse_shape(generation, topology)
        reply = self._command(
            op="add_slice", generation=shape.generation.name, topology=shape.topology
        )
        self.slice_names.append(reply["slice"])
        return reply["slice"]

    def remove_host(self, slice_name: str, worker_id: int) -> None:
        """Kill one simulated host abruptly, as a preempted TPU VM would vanish."""
        self._command(op="remove_host", slice=slice_name, worker_id=worker_id)

    def add_host(self, slice_name: str, worker_id: int) -> None:
        """Start a replacement for a lost host of an existing slice."""
        self._command(op="add_host", slice=slice_name, worker_id=worker_id)

    def connect(self) -> Connection:
        """Make this process a driver of the simulated cluster."""
        global _connection
        conn = connect(self.address, node_ip=self.node_ip)
        _connection = Connection(conn.address, conn.node_ip, simulated=True)
        return _connection

    def process_ids(self) -> set[int]:
        """Every live process of the cluster (simulator, Ray daemons and workers)."""
        return _cluster_processes(self._process.pid, self.temp_dir)

    def shutdown(self) -> None:
        """Disconnect (if connected here) and stop every process of the cluster. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if _connection is not None and _connection.address == getattr(self, "address", None):
            disconnect()
        self._finalizer()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = "stopped" if self._closed else getattr(self, "address", "starting")
        return f"LocalCluster({state}, slices={getattr(self, 'slice_names', [])})"


def _log_warnings(path: str, limit: int = 5) -> str:
    try:
        with open(path) as log_file:
            lines = [line.strip() for line in log_file if line.startswith("WARNING:")]
    except OSError:
        return ""
    return (" Simulator: " + "; ".join(lines[-limit:]) + ".") if lines else ""


def _slice_shapes(slices: object) -> list[SliceShape]:
    example = "[('v6e', '2x2')] or [('v6e', '4x4'), ('v6e', '2x2')]"
    if isinstance(slices, (str, bytes, SliceShape)) or not isinstance(slices, Iterable):
        raise ValueError(
            f"slices must be a list of (generation, topology) pairs such as {example}, "
            f"got {slices!r}."
        )
    shapes = []
    for pair in list(slices):
        if isinstance(pair, SliceShape):
            shapes.append(pair)
            continue
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(
                f"slices must be a list of (generation, topology) pairs such as {example}; "
                f"{pair!r} in {slices!r} is not a pair (for one slice, put its pair in a list)."
            )
        shapes.append(parse_shape(*pair))
    return shapes


# Ray puts Unix sockets under its temp dir, ``<dir>/session_<date>_<pid>/sockets/
# plasma_store.<n>``: about 75 characters below the dir, within the 107 a socket path may have.
_MAX_TEMP_ROOT = 30


def _short_temp_root() -> str | None:
    """The system temp folder (``TMPDIR``), or ``/tmp`` when that path is too long for the
    sockets Ray makes below it."""
    root = tempfile.gettempdir()
    if len(root) <= _MAX_TEMP_ROOT or not os.access("/tmp", os.W_OK):
        return root
    return "/tmp"


def _cluster_processes(simulator_pid: int, temp_dir: str) -> set[int]:
    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or ())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if proc.info["pid"] == simulator_pid or temp_dir in cmdline:
            found.add(proc.info["pid"])
    with contextlib.suppress(psutil.NoSuchProcess):
        found.update(c.pid for c in psutil.Process(simulator_pid).children(recursive=True))
    return found


def _stop_simulator(process: subprocess.Popen, temp_dir: str, grace_s: float = 20.0) -> None:
    leftovers = _cluster_processes(process.pid, temp_dir)
    if process.poll() is None:
        try:
            process.stdin.write(json.dumps({"op": "shutdown"}) + "\n")
            process.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
    # Ray workers that outlive their raylet by a moment, and anything the graceful path
    # missed, are found by the session directory on their command lines.
    leftovers |= _cluster_processes(process.pid, temp_dir)
    _kill(leftovers - {os.getpid()})
    shutil.rmtree(temp_dir, ignore_errors=True)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _kill(pids: Iterable[int], timeout_s: float = 5.0) -> None:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=timeout_s)


_open_clusters: weakref.WeakSet[LocalCluster] = weakref.WeakSet()


@atexit.register
def _shutdown_open_clusters() -> None:
    for cluster in list(_open_clusters):
        cluster.shutdown()


def local_cluster(
    slices: Sequence[tuple[str, str] | SliceShape] = (("v6e", "2x2"),),
    *,
    connect: bool = True,
    head_cpus: int = 2,
    cpus_per_chip: int = 4,
    timeout_s: float = 180.0,
) -> LocalCluster:
    """Start the embedded simulated GKE TPU cluster and (by default) connect to it.

    Args:
        slices: the slices to create, as (generation, topology) pairs or
            :class:`~workbench.tpu.catalog.SliceShape` values; several (even of the same
            shape) give several slices, for contention.
        connect: connect this process as the cluster's driver.
        head_cpus: logical CPUs of the head node (for helper actors that need no TPU).
        cpus_per_chip: logical CPUs each simulated host offers per chip; a real v6e host
            has dozens, and each chip's learner and rollout actors need some.
        timeout_s: deadline for the whole cluster to come up.

    Returns:
        The running cluster; ``shutdown()`` (or leaving a ``with`` block, or interpreter
        exit) stops every process it started.

    Raises:
        CatalogError: a slice shape the catalog refuses (nothing is started).
        ValueError: ``slices`` is not a list of pairs, or a count or timeout is not a
            positive number (nothing is started).
        ClusterError: the cluster did not come up in time.
    """
    cluster = LocalCluster(
        slices, head_cpus=head_cpus, cpus_per_chip=cpus_per_chip, timeout_s=timeout_s
    )
    _open_clusters.add(cluster)
    if connect:
        try:
            cluster.connect()
        except Exception:
            cluster.shutdown()
            raise
    return cluster

