"""A learner group's sockets listen on the node's own address, also on a host whose name
resolves to an address others can reach.

The test makes such a host: a network namespace with a second interface (10.200.0.1) and,
in that namespace, an /etc/hosts that resolves this machine's name to it. Two learner
processes join a ``jax.distributed`` group there and run a collective, then report their
listening sockets. Without the workbench's binding, gloo listens on the hostname's address
(the control run shows it), so the check can fail.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

OUTSIDE = "10.200.0.1"
CHILD = """
import json, sys
rank, port, bind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "bind"
from workbench.learn.platform import configure_jax_platform, join_distributed
configure_jax_platform("cpu")
join_distributed(f"127.0.0.1:{port}", 2, rank, 60, "127.0.0.1" if bind else None)
import jax, numpy as np, psutil, socket
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("chips",))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("chips")),
                                           np.ones((1,), np.float32))
total = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "chips"), mesh=mesh,
                              in_specs=P("chips"), out_specs=P()))(x)
import ipaddress
def v4(ip):  # an IPv4-mapped IPv6 address ("::ffff:127.0.0.1") is its IPv4 address
    mapped = getattr(ipaddress.ip_address(ip), "ipv4_mapped", None)
    return str(mapped) if mapped else ip
listening = sorted({v4(c.laddr.ip) for c in psutil.Process().net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN})
print(json.dumps({"rank": rank, "sum": float(np.asarray(total.addressable_data(0))[0]),
                  "listening": listening}), flush=True)
jax.distributed.shutdown()
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def exposed_host():
    """A network namespace whose hostname resolves to a non-loopback address."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make a network namespace")
    name = f"wb-{uuid.uuid4().hex[:8]}"
    hosts = Path("/etc/netns") / name / "hosts"
    try:
        _ip("netns", "add", name)
        _ip("-n", name, "link", "set", "lo", "up")
        # A veth pair with both ends inside: a non-loopback interface (some kernels have
        # no dummy device type).
        _ip("-n", name, "link", "add", "outside0", "type", "veth", "peer", "name", "outside1")
        _ip("-n", name, "addr", "add", f"{OUTSIDE}/24", "dev", "outside0")
        _ip("-n", name, "link", "set", "outside1", "up")
        _ip("-n", name, "link", "set", "outside0", "up")
        # `ip netns exec` puts /etc/netns/<name>/hosts in place of /etc/hosts.
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(f"127.0.0.1 localhost\n{OUTSIDE} {socket.gethostname()}\n")
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
        shutil.rmtree(hosts.parent, ignore_errors=True)


def _group(namespace: str, bind: bool) -> list[dict]:
    port = 23456 + uuid.uuid4().int % 1000
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["JAX_PLATFORMS"] = "cpu"
    processes = [
        subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-c", CHILD,
                          str(rank), str(port), "bind" if bind else "default"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for rank in range(2)
    ]
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=240)
        assert process.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def test_the_hostname_resolves_outside_loopback_in_the_namespace(exposed_host):
    done = subprocess.run(["ip", "netns", "exec", exposed_host, sys.executable, "-c",
                           "import socket; print(socket.gethostbyname(socket.gethostname()))"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == OUTSIDE


def test_learners_listen_only_on_the_node_address_they_are_given(exposed_host):
    reports = _group(exposed_host, bind=True)
    assert [r["sum"] for r in reports] == [2.0, 2.0]
    for report in reports:
        assert report["listening"] == ["127.0.0.1"], report


def test_without_the_binding_gloo_would_listen_on_the_hostnames_address(exposed_host):
    # The control: what JAX does by default on such a host, which the binding prevents.
    reports = _group(exposed_host, bind=False)
    assert any(OUTSIDE in r["listening"] for r in reports), reports
