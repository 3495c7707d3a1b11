"""A Ray cluster started the way KubeRay starts one: plain ``ray start`` processes, a CPU-only
head with a Ray Client server, and TPU hosts as separate nodes carrying what GKE's TPU
webhook gives a TPU VM (the ``TPU_*`` variables, the ``TPU`` resource). Not the project's
simulator: nothing of the workbench starts it.

Every node runs under ``ray start --block``, so each has one process that owns it; the
cluster is stopped by stopping those, then anything left that names its temp dir, and the
Ray Client server (which names neither) by its process id.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from workbench.tpu.catalog import parse_shape
from workbench.tpu.ports import free_port

NODE_IP = "127.0.0.2"  # `ray start` rewrites a literal 127.0.0.1 to the machine's address
RAY = str(Path(sys.executable).with_name("ray"))


@dataclass
class KubeRayLikeCluster:
    temp_dir: Path
    ray_temp_dir: str = ""
    """Ray's own temp dir: short, since Ray's Unix socket paths below it must stay within
    107 characters (a pytest tmp_path is too long)."""
    gcs_address: str = ""
    client_address: str = ""
    slices: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)
    commands: list[tuple[list[str], dict]] = field(default_factory=list)
    restarts: int = 0
    tree: set[int] = field(default_factory=set)
    first_port_range: int = field(default_factory=lambda: free_port(NODE_IP) % 16)
    """Where this cluster's worker-port ranges start (see ``_ports``): random per cluster."""

    def env(self, extra: dict | None = None) -> dict:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TPU_", "RAY_ADDRESS", "RAY_ENABLE_WINDOWS"))}
        # No token authentication (KubeRay's default), whatever an earlier run left.
        # TPU_LOG_DIR: as on a TPU pod, the node's libtpu log folder is its own (Ray streams
        # it to drivers), not the machine's shared /tmp/tpu_logs.
        tpu_logs = self.temp_dir / "tpu_logs"
        tpu_logs.mkdir(exist_ok=True)
        env.update({"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                    "JAX_PLATFORMS": "cpu", "TPU_LOG_DIR": str(tpu_logs), **(extra or {})})
        return env

    def _ports(self) -> list[str]:
        # Each node its own worker-port range, between the Ray Client server's per-job
        # servers (23000-23999: a worker holding one of those ports fails the next client's
        # connection) and the kernel's ephemeral ports (32768 up, where the GCS and client
        # ports come from). A random start per cluster, then one 250-port step per node.
        step = (self.first_port_range + len(self.processes)) % 32
        low = 24100 + 250 * step
        return ["--min-worker-port", str(low), "--max-worker-port", str(low + 200)]

    def _start(self, args: list[str], env: dict) -> None:
        self.commands.append((args, env))
        self.processes.append(self._launch(len(self.processes), "w"))

    def _launch(self, node: int, mode: str) -> subprocess.Popen:
        args, env = self.commands[node]
        log = open(self.temp_dir / f"node-{node}.log", mode)  # noqa: SIM115
        return subprocess.Popen([RAY, "start", "--block", *args], stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def _restart_dead_nodes(self, limit: int = 2) -> None:
        # A kubelet restarts a pod whose `ray start` exited. Nodes started at once on one
        # machine pick their agents' ports at random, each in its own temp dir, so two can
        # now and then pick the same one and the later one's `ray start` exits.
        for node, process in enumerate(self.processes):
            if process.poll() is None or self.restarts >= limit:
                continue
            log = self.temp_dir / f"node-{node}.log"
            print(f"node {node} exited with {process.returncode} while the cluster came up; "
                  f"restarting it. Its log ends:\n{log.read_text()[-3000:]}", file=sys.stderr)
            self.restarts += 1
            self.processes[node] = self._launch(node, "a")

    def start_head(self, cpus: int = 2) -> None:
        gcs, client = free_port(NODE_IP), free_port(NODE_IP)
        self.gcs_address = f"{NODE_IP}:{gcs}"
        self.client_address = f"ray://{NODE_IP}:{client}"
        self._start(["--head", "--node-ip-address", NODE_IP, "--port", str(gcs),
                     "--ray-client-server-port", str(client), "--include-dashboard", "false",
                     "--num-cpus", str(cpus), "--disable-usage-stats",
                     "--temp-dir", self.ray_temp_dir, *self._ports()], self.env())

    def add_slice(self, generation: str, topology: str, cpus_per_chip: int = 2) -> str:
        """The hosts of one TPU slice, each a `ray start` node with the webhook's view."""
        shape = parse_shape(generation, topology)
        name = f"kuberay-{shape.pod_type}-{len(self.slices)}"
        for worker in range(shape.hosts):
            env = self.env({"TPU_NAME": name, "TPU_WORKER_ID": str(worker),
                            "TPU_ACCELERATOR_TYPE": shape.pod_type,
                            "TPU_TOPOLOGY": shape.topology})
            # A temp dir per node: nodes started at once on one machine would otherwise
            # race for the same socket names in the head's (Ray picks the first free one).
            node_dir = f"{self.ray_temp_dir}/n{len(self.processes)}"
            self._start(["--address", self.gcs_address, "--node-ip-address", NODE_IP,
                         "--temp-dir", node_dir,
                         "--num-cpus", str(shape.chips_per_host * cpus_per_chip),
                         "--resources", json.dumps({"TPU": shape.chips_per_host}),
                         *self._ports()], env)
        self.slices.append(name)
        return name

    def wait_for_nodes(self, count: int, timeout_s: float = 180.0) -> None:
        """Until ``count`` nodes are alive, asked from a driver process of its own."""
        script = textwrap.dedent(f"""
            import time, ray
            ray.init(address={self.gcs_address!r}, logging_level="ERROR")
            deadline = time.monotonic() + {timeout_s}
            while time.monotonic() < deadline:
                if sum(n["Alive"] for n in ray.nodes()) >= {count}:
                    print("ready"); break
                time.sleep(0.5)
        """)
        driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=self.env())
        deadline = time.monotonic() + timeout_s + 60
        while driver.poll() is None and time.monotonic() < deadline:
            self._restart_dead_nodes()
            time.sleep(0.5)
        if driver.poll() is None:
            driver.kill()
        out, err = driver.communicate()
        assert "ready" in out, (out, err[-3000:], self.logs())
        for process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                self.tree |= {c.pid for c in psutil.Process(process.pid).children(True)}

    def logs(self) -> str:
        return "\n".join(p.read_text()[-1500:] for p in sorted(self.temp_dir.glob("node-*.log")))

    def live_processes(self) -> list[int]:
        marker = self.ray_temp_dir
        found = {p.pid for p in self.processes if p.poll() is None}
        for proc in psutil.process_iter(["pid", "cmdline"]):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if marker in " ".join(proc.info["cmdline"] or ()):
                    found.add(proc.info["pid"])
        for pid in self.tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    found.add(pid)
        return sorted(found - {os.getpid()})

    def stop(self) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        # One deadline for all: a `ray start --block` that has not exited 10 s after its
        # SIGTERM is killed with the rest below (a pod's SIGKILL after its grace period).
        deadline = time.monotonic() + 10
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
        leftovers = []
        for pid in self.live_processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                leftovers.append(psutil.Process(pid))
        for proc in leftovers:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(leftovers, timeout=10)
        shutil.rmtree(self.ray_temp_dir, ignore_errors=True)


def start_cluster(temp_dir: Path, slices: list[tuple[str, str]]) -> KubeRayLikeCluster:
    cluster = KubeRayLikeCluster(temp_dir, ray_temp_dir=tempfile.mkdtemp(prefix="kr-",
                                                                          dir="/tmp"))
    try:
        cluster.start_head()
        time.sleep(2)  # the head's GCS before the hosts try to join it
        nodes = 1
        for generation, topology in slices:
            cluster.add_slice(generation, topology)
            nodes += parse_shape(generation, topology).hosts
        cluster.wait_for_nodes(nodes)
    except BaseException:
        cluster.stop()
        raise
    return cluster
