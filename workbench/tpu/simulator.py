"""The process that runs a simulated GKE TPU cluster: a real multi-node Ray cluster
on this machine whose worker nodes look like the hosts of TPU slices.

Run as ``python -m workbench.tpu.simulator SPEC_JSON`` by :mod:`workbench.tpu.cluster`, never
imported by user code. It starts a Ray head node and one Ray node per simulated TPU host,
each with the resources, labels and process environment that GKE's TPU webhook gives a
real host, then serves one JSON command per stdin line (add a slice, lose a host, add a
host back) and answers with one JSON line on stdout. When stdin closes (the kernel or CLI
that started it has gone) it stops every node it started, so nothing outlives its owner.

Each node is started with Ray's own ``Node`` class, as Ray's cluster utilities do,
rather than ``ray start``: the CLI rewrites a 127.0.0.1 node address to the machine's
external IP, and a simulated cluster must stay on loopback: every socket it listens on is
bound to 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass

from workbench.tpu.catalog import SliceShape, parse_shape
from workbench.tpu.ports import free_port

log = logging.getLogger("workbench.tpu.simulator")

# NOTE: Ray binds its gRPC servers (GCS, raylet, object manager, every worker), its agents
# and its metrics exporters to loopback only when the node address is exactly 127.0.0.1;
# for any other address, even 127.0.0.2, they listen on all interfaces. Ray also swaps a
# 127.0.0.1 it is given for the machine's external IP unless "local-only" mode is on (the
# default on macOS and Windows, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 elsewhere), so the
# simulator's process tree runs with LOCAL_ONLY_ENV and the driver connects the same way
# (see workbench.tpu.cluster).
LOOPBACK_NODE_IP = "127.0.0.1"
LOCAL_ONLY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}

TPU_ENV_KEYS = ("TPU_NAME", "TPU_WORKER_ID", "TPU_ACCELERATOR_TYPE", "TPU_TOPOLOGY",
                "TPU_WORKER_HOSTNAMES")
AGENT_PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port",
               "runtime_env_agent_port")


def host_environment(shape: SliceShape, slice_name: str, worker_id: int,
                     node_ip: str = LOOPBACK_NODE_IP) -> dict[str, str]:
    """The variables GKE puts in every process of a TPU host; Ray reads them to label
    the node and to answer ``ray.util.tpu`` queries from inside a worker. A multi-host
    slice's hosts also learn every host's name (``TPU_WORKER_HOSTNAMES``, which KubeRay's
    TPU webhook sets from the worker group's pods); here every host is ``node_ip``."""
    environment = {
        "TPU_NAME": slice_name,
        "TPU_WORKER_ID": str(worker_id),
        "TPU_ACCELERATOR_TYPE": shape.pod_type,
        "TPU_TOPOLOGY": shape.topology,
        # The only difference from a real host: JAX runs on the CPU.
        "JAX_PLATFORMS": "cpu",
    }
    if not shape.single_host:
        environment["TPU_WORKER_HOSTNAMES"] = ",".join([node_ip] * shape.hosts)
    return environment


def simulated_slice_name(shape: SliceShape, index: int) -> str:
    return f"sim-{shape.pod_type}-{index}"


@dataclass
class _Host:
    slice_name: str
    worker_id: int
    node: object  # ray._private.node.Node


class Simulator:
    """Owns the Ray nodes of one simulated cluster (runs inside the simulator process)."""

    def __init__(self, spec: dict) -> None:
        self.node_ip: str = spec.get("node_ip", LOOPBACK_NODE_IP)
        self.temp_dir: str = spec["temp_dir"]
        self.object_store_bytes: int = int(spec.get("object_store_bytes", 80 * 1024**2))
        self.cpus_per_chip: int = int(spec.get("cpus_per_chip", 4))
        self.head = None
        self.hosts: list[_Host] = []
        self.shapes: dict[str, SliceShape] = {}
        self._slice_counter = 0
        # NOTE: a Ray node links the folder in TPU_LOG_DIR (else the machine's
        # /tmp/tpu_logs) into its logs, and Ray streams those files to every driver: any
        # libtpu that ever ran on this machine would flood the notebook. The simulated
        # nodes get an empty folder of their own instead (their JAX runs on the CPU).
        self.tpu_log_dir = os.path.join(self.temp_dir, "tpu_logs")
        os.makedirs(self.tpu_log_dir, exist_ok=True)
        self._start_head(int(spec.get("head_cpus", 2)))

    def _node(self, head: bool, num_cpus: int, resources: dict[str, float], env: dict[str, str]):
        params = dict(
            node_ip_address=self.node_ip,
            num_cpus=num_cpus,
            resources=resources,
            object_store_memory=self.object_store_bytes,
            min_worker_port=0,
            max_worker_port=0,
        )
        if head:
            # Binder gives a session about 2 GiB, so the head starts only what a simulated
            # cluster uses: no autoscaler monitor (its hosts change only when asked), no
            # log monitor (as on the hosts), and no idle worker started ahead of need.
            params.update(temp_dir=self.temp_dir, include_dashboard=False, no_monitor=True,
                          include_log_monitor=False,
                          _system_config={"prestart_worker_first_driver": False})
        else:
            params.update(
                gcs_address=self.head.gcs_address,
                include_log_monitor=False,
                node_manager_port=0,
            )
        # NOTE: Ray resolves a node's TPU resources and labels from this process's
        # environment, and the raylet (hence every worker on the node) inherits it.
        for key in TPU_ENV_KEYS + ("JAX_PLATFORMS",):
            os.environ.pop(key, None)
        os.environ.update(env)
        os.environ["TPU_LOG_DIR"] = self.tpu_log_dir
        try:
            return self._start_node(params, head)
        finally:
            for key in env:
                os.environ.pop(key, None)

    def _start_node(self, params: dict, head: bool, attempts: int = 3):
        import psutil
        import ray._private.node
        from ray._private.parameter import RayParams

        me = psutil.Process()
        for attempt in range(1, attempts + 1):  # the last attempt raises or returns
            before = {c.pid for c in me.children(recursive=True)}
            # NOTE: a raylet left to learn its agents' ports from the agents waits a fixed
            # 15 s for them and aborts if they are slower, as Python processes starting on a
            # busy machine can be; given the ports, it does not wait. Ray's fixed default
            # for one of them would also clash between clusters on 127.0.0.1.
            ports = {name: free_port(self.node_ip) for name in AGENT_PORTS}
            try:
                # Fresh parameters each attempt: Ray writes the ports it picked into them.
                return ray._private.node.Node(
                    RayParams(**params, **ports), head=head, shutdown_at_exit=False,
                    spawn_reaper=head,
                )
            except Exception as error:
                # NOTE: Ray gives a new raylet a fixed 30 s to register, and the raylet gives
                # its agents a fixed 15 s to start; on a loaded machine either can be missed.
                # Remove what this attempt started, then try again.
                if attempt == attempts or "timed out" not in str(error):
                    raise
                role = "head" if head else "host"
                log.warning("a simulated %s missed Ray's start-up deadline; retrying", role)
                started = [c for c in me.children(recursive=True) if c.pid not in before]
                for child in started:
                    child.kill()
                # The next attempt must not find this one's ports still held.
                psutil.wait_procs(started, timeout=10)
        raise RuntimeError(f"no simulated node came up in {attempts} attempts")

    def _start_head(self, head_cpus: int) -> None:
        self.head = self._node(True, head_cpus, {}, {})

    def add_slice(self, generation: str, topology: str) -> dict:
        shape = parse_shape(generation, topology)
        name = simulated_slice_name(shape, self._slice_counter)
        self._slice_counter += 1
        self.shapes[name] = shape
        for worker_id in range(shape.hosts):
            self.add_host(name, worker_id)
        return {"slice": name, "pod_type": shape.pod_type, "hosts": shape.hosts}

    def add_host(self, slice_name: str, worker_id: int) -> dict:
        shape = self.shapes[slice_name]
        if any(h.slice_name == slice_name and h.worker_id == worker_id for h in self.hosts):
            raise ValueError(f"host {worker_id} of {slice_name} is already running")
        node = self._node(
            False,
            shape.chips_per_host * self.cpus_per_chip,
            {"TPU": float(shape.chips_per_host)},
            host_environment(shape, slice_name, worker_id, self.node_ip),
        )
        self.hosts.append(_Host(slice_name, worker_id, node))
        return {"slice": slice_name, "worker_id": worker_id, "node_id": node.node_id}

    def remove_host(self, slice_name: str, worker_id: int) -> dict:
        for host in self.hosts:
            if host.slice_name == slice_name and host.worker_id == worker_id:
                # Abrupt, like a preempted VM: no graceful drain.
                host.node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
                self.hosts.remove(host)
                return {"slice": slice_name, "worker_id": worker_id}
        raise ValueError(f"no running host {worker_id} in slice {slice_name}")

    def shutdown(self) -> None:
        for host in reversed(self.hosts):
            host.node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
        self.hosts.clear()
        if self.head is not None:
            self.head.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
            self.head = None

    def handle(self, command: dict) -> dict:
        op = command.get("op")
        if op == "add_slice":
            return self.add_slice(command["generation"], command["topology"])
        if op == "add_host":
            return self.add_host(command["slice"], int(command["worker_id"]))
        if op == "remove_host":
            return self.remove_host(command["slice"], int(command["worker_id"]))
        raise ValueError(f"unknown simulator command {op!r}")


_replies = sys.stdout


def _reply(payload: dict) -> None:
    _replies.write(json.dumps(payload) + "\n")
    _replies.flush()


def main(argv: list[str]) -> int:
    global _replies
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # Replies get a private copy of stdout; fd 1 becomes stderr so that nothing Ray or
    # its daemons print can corrupt the reply stream or hold the pipe open.
    _replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    spec = json.loads(argv[0])
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray reads this when it is first imported; workbench.tpu.cluster also starts this process
    # with it, in case a module imported before main() already imported Ray.
    os.environ.update(LOCAL_ONLY_ENV)
    simulator = None
    try:
        simulator = Simulator(spec)
        slices = [simulator.add_slice(g, t) for g, t in spec.get("slices", [])]
        _reply(
            {
                "ok": True,
                "event": "ready",
                "address": simulator.head.gcs_address,
                "node_ip": simulator.node_ip,
                "slices": slices,
            }
        )
        for line in sys.stdin:
            if not line.strip():
                continue
            command = json.loads(line)
            if command.get("op") == "shutdown":
                break
            try:
                _reply({"ok": True, **simulator.handle(command)})
            except Exception as error:  # reported to the client, which raises it
                _reply({"ok": False, "error": f"{type(error).__name__}: {error}"})
    except Exception as error:
        _reply({"ok": False, "event": "failed", "error": f"{type(error).__name__}: {error}"})
        return 1
    finally:
        if simulator is not None:
            simulator.shutdown()
    _reply({"ok": True, "event": "stopped"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
