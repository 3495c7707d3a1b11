"""Nothing the simulated cluster runs listens beyond loopback: not Ray's GCS, raylets, object
managers and agents, not the driver, not the workers it leases, not a learner group."""

from __future__ import annotations

import ipaddress
import os
import socket
import time

import psutil
import pytest
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from support.cluster_state import live_actors

import workbench as wb

# Every test here scans the session cluster's processes: the slow tier.
pytestmark = pytest.mark.slow


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    # A dual-stack socket bound to 127.0.0.1 shows as ::ffff:127.0.0.1.
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _listening(pids: set[int]) -> list[tuple[str, int, int]]:
    """(ip, port, pid) of every listening TCP socket and every bound, unconnected UDP socket
    the given processes hold."""
    found = []
    for conn in psutil.net_connections(kind="inet"):
        if conn.pid not in pids or not conn.laddr:
            continue
        tcp_listen = conn.type == socket.SOCK_STREAM and conn.status == psutil.CONN_LISTEN
        udp_bound = conn.type == socket.SOCK_DGRAM and not conn.raddr
        if tcp_listen or udp_bound:
            found.append((conn.laddr.ip, conn.laddr.port, conn.pid))
    return found


def _describe(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline()).strip()[:80]
    except psutil.Error:
        return "(gone)"


def _exposed(pids: set[int]) -> list[str]:
    return [f"{f'[{ip}]' if ':' in ip else ip}:{port} held by pid {pid} ({_describe(pid)})"
            for ip, port, pid in _listening(pids) if not _is_loopback(ip)]


def _no_actors_left(timeout_s: float = 30.0) -> bool:
    # ray.kill returns before the GCS has marked the actor dead.
    deadline = time.monotonic() + timeout_s
    while live_actors() and time.monotonic() < deadline:
        time.sleep(0.5)
    return live_actors() == []


def test_the_scan_sees_a_socket_open_to_every_interface(sim_cluster):
    # The check below must be able to fail: a socket this driver binds to all interfaces
    # shows up, and one bound to loopback does not.
    with socket.socket() as exposed, socket.socket() as private:
        exposed.bind(("0.0.0.0", 0))
        exposed.listen()
        private.bind(("127.0.0.1", 0))
        private.listen()
        ports = exposed.getsockname()[1], private.getsockname()[1]
        problems = _exposed(sim_cluster.process_ids() | {os.getpid()})
    assert any(f"0.0.0.0:{ports[0]} held by pid {os.getpid()}" in p for p in problems), problems
    assert not any(f":{ports[1]} " in p for p in problems)


def test_cluster_driver_and_its_workers_listen_on_loopback_only(cluster):
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert all(n["NodeManagerAddress"] == "127.0.0.1" for n in nodes)

    @ray.remote(num_cpus=0)
    class Worker:
        def pid(self) -> int:
            return os.getpid()

    # One leased worker on every node of the cluster (head and each TPU host).
    workers = [
        Worker.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
        .remote()
        for n in nodes
    ]
    try:
        worker_pids = set(ray.get([w.pid.remote() for w in workers], timeout=120))
        pids = cluster.process_ids() | {os.getpid()}
        assert worker_pids <= pids  # the cluster's process list covers the driver's workers
        listening = _listening(pids)
        listeners = {pid for _, _, pid in listening}
        # GCS, every raylet and every worker hold gRPC servers: the scan found them all.
        assert worker_pids <= listeners and os.getpid() in listeners
        assert len(listeners) >= 2 * len(nodes)
        assert _exposed(pids) == []
    finally:
        for worker in workers:
            ray.kill(worker)
    assert _no_actors_left()


def test_a_learner_group_listens_on_loopback_only(cluster):
    # jax.distributed's coordinator service runs in the rank-0 learner: it is the one
    # server of a training run that is not Ray's.
    from workbench.learn.platform import join_distributed

    @ray.remote(num_cpus=1, resources={"TPU": 1})
    class Member:
        def address(self) -> str:
            from workbench.tpu.ports import free_port

            host = ray.util.get_node_ip_address()
            return f"{host}:{free_port(host)}"

        def join(self, coordinator: str, rank: int) -> int:
            join_distributed(coordinator, 2, rank, timeout_s=60)
            return os.getpid()

    with wb.reserve("v6e", "2x2", cpus_per_chip=1) as tpu_slice:
        members = [Member.options(scheduling_strategy=tpu_slice.scheduling(rank)).remote()
                   for rank in range(2)]
        try:
            coordinator = ray.get(members[0].address.remote(), timeout=120)
            pids = set(ray.get([m.join.remote(coordinator, r) for r, m in enumerate(members)],
                               timeout=180))
            port = int(coordinator.rsplit(":", 1)[1])
            held = {(p, pid) for _, p, pid in _listening(pids)}
            assert any(p == port for p, _ in held), "the coordinator service was not found"
            assert _exposed(pids) == []
        finally:
            for member in members:
                ray.kill(member)
    assert _no_actors_left()
