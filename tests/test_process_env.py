"""The per-chip TPU process environment against the values JAX's multi-process harness
(jax/_src/test_multiprocess.py) and pytorch/xla (torch_xla/_internal/tpu.py and
test/pjrt/test_internal_tpu.py) give; pure, no cluster and no JAX.

Every expected value below is written out by hand from those sources, not computed."""

from __future__ import annotations

import pickle
import random

import pytest

from workbench.tpu.catalog import all_shapes, parse_shape
from workbench.tpu.process_env import (
    ChipProcess,
    MeshLayout,
    ProcessEnvironment,
    ProcessLayoutError,
    chip_layout,
    host_bounds,
    host_chip_bounds,
)

# What Ray leaves in the environment of an actor holding {"TPU": 1} of a bigger host
# (ray/_private/accelerators/tpu.py, set_current_process_visible_accelerator_ids).
RAY_ONE_CHIP = {"TPU_CHIPS_PER_HOST_BOUNDS": "1,1,1", "TPU_HOST_BOUNDS": "1,1,1"}


def _host_ip(worker: int) -> str:
    return f"10.0.0.{worker + 1}"


def _reports(hosts: int, chips: list[int], *, one_chip_host: bool = False) -> list[ChipProcess]:
    """One report per chip, rank = worker * chips + position, libtpu ports from 8476 on
    each host as pytorch/xla's configure_topology picks them."""
    reports = []
    for worker in range(hosts):
        for local, chip in enumerate(chips):
            env = {"TPU_WORKER_ID": str(worker), "TPU_WORKER_HOSTNAMES": "h0,h1,h2,h3"}
            if not one_chip_host:
                env |= {"TPU_VISIBLE_CHIPS": str(chip), **RAY_ONE_CHIP}
            reports.append(ChipProcess(
                rank=worker * len(chips) + local, worker_id=worker, address=_host_ip(worker),
                environment=env, tpu_port=8476 + local, coordinator_port=9476 + local))
    return reports


def _replace(reports: list[ChipProcess], index: int, **changes) -> list[ChipProcess]:
    out = list(reports)
    old = out[index]
    fields = dict(rank=old.rank, worker_id=old.worker_id, address=old.address,
                  environment=old.environment, tpu_port=old.tpu_port,
                  coordinator_port=old.coordinator_port)
    out[index] = ChipProcess(**(fields | changes))
    return out


# generation, topology, hosts, chips on a host, host chip bounds, host bounds,
# TPU_PROCESS_BOUNDS, TPU_PROCESS_ADDRESSES.
TABLE = [
    ("v4", "2x2x1", 1, 4, (2, 2, 1), (1, 1, 1), "2,2,1",
     "10.0.0.1:8476,10.0.0.1:8477,10.0.0.1:8478,10.0.0.1:8479"),
    ("v4", "2x2x2", 2, 4, (2, 2, 1), (1, 1, 2), "2,2,2",
     "10.0.0.1:8476,10.0.0.1:8477,10.0.0.1:8478,10.0.0.1:8479,"
     "10.0.0.2:8476,10.0.0.2:8477,10.0.0.2:8478,10.0.0.2:8479"),
    ("v5e", "2x2", 1, 4, (2, 2, 1), (1, 1, 1), "2,2,1",
     "10.0.0.1:8476,10.0.0.1:8477,10.0.0.1:8478,10.0.0.1:8479"),
    # The v5e-8 board lies 4x2 (JAX's harness), though GKE calls the shape 2x4.
    ("v5e", "2x4", 1, 8, (4, 2, 1), (1, 1, 1), "4,2,1",
     "10.0.0.1:8476,10.0.0.1:8477,10.0.0.1:8478,10.0.0.1:8479,"
     "10.0.0.1:8480,10.0.0.1:8481,10.0.0.1:8482,10.0.0.1:8483"),
    ("v5e", "4x4", 4, 4, (2, 2, 1), (2, 2, 1), "4,4,1",
     "10.0.0.1:8476,10.0.0.1:8477,10.0.0.1:8478,10.0.0.1:8479,"
     "10.0.0.2:8476,10.0.0.2:8477,10.0.0.2:8478,10.0.0.2:8479,"
     "10.0.0.3:8476,10.0.0.3:8477,10.0.0.3:8478,10.0.0.3:8479,"
     "10.0.0.4:8476,10.0.0.4:8477,10.0.0.4:8478,10.0.0.4:8479"),
    ("v5p", "2x2x1", 1, 4, (2, 2, 1), (1, 1, 1), "2,2,1",
     "10.0.0.1:8476,10.0.0.1:8477,10.0.0.1:8478,10.0.0.1:8479"),
    ("v5p", "2x2x2", 2, 4, (2, 2, 1), (1, 1, 2), "2,2,2",
     "10.0.0.1:8476,10.0.0.1:8477,10.0.0.1:8478,10.0.0.1:8479,"
     "10.0.0.2:8476,10.0.0.2:8477,10.0.0.2:8478,10.0.0.2:8479"),
    ("v6e", "1x1", 1, 1, (1, 1, 1), (1, 1, 1), "1,1,1", "10.0.0.1:8476"),
    ("v6e", "2x2", 1, 4, (2, 2, 1), (1, 1, 1), "2,2,1",
     "10.0.0.1:8476,10.0.0.1:8477,10.0.0.1:8478,10.0.0.1:8479"),
    # The v6e-8 board lies 2x4 (JAX's harness: chips-per-host bounds 2,4,1).
    ("v6e", "2x4", 1, 8, (2, 4, 1), (1, 1, 1), "2,4,1",
     "10.0.0.1:8476,10.0.0.1:8477,10.0.0.1:8478,10.0.0.1:8479,"
     "10.0.0.1:8480,10.0.0.1:8481,10.0.0.1:8482,10.0.0.1:8483"),
    ("v6e", "4x4", 4, 4, (2, 2, 1), (2, 2, 1), "4,4,1",
     "10.0.0.1:8476,10.0.0.1:8477,10.0.0.1:8478,10.0.0.1:8479,"
     "10.0.0.2:8476,10.0.0.2:8477,10.0.0.2:8478,10.0.0.2:8479,"
     "10.0.0.3:8476,10.0.0.3:8477,10.0.0.3:8478,10.0.0.3:8479,"
     "10.0.0.4:8476,10.0.0.4:8477,10.0.0.4:8478,10.0.0.4:8479"),
]


@pytest.mark.parametrize(
    "generation, topology, hosts, per_host, chip_bounds, hosts_bounds, bounds, addresses",
    TABLE, ids=[f"{row[0]}-{row[1]}" for row in TABLE])
def test_variables_match_the_harnesses(generation, topology, hosts, per_host, chip_bounds,
                                       hosts_bounds, bounds, addresses):
    shape = parse_shape(generation, topology)
    assert host_chip_bounds(shape) == chip_bounds
    assert host_bounds(shape) == hosts_bounds
    one_chip_host = per_host == 1
    layout = chip_layout(shape, _reports(hosts, list(range(per_host)),
                                         one_chip_host=one_chip_host))
    assert layout.num_processes == hosts * per_host
    assert layout.coordinator == "10.0.0.1:9476"
    for rank, env in enumerate(layout.processes):
        local = rank % per_host
        expected = {
            "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_BOUNDS": bounds,
            "TPU_PROCESS_ADDRESSES": addresses,
            "TPU_PROCESS_PORT": str(8476 + local),
            "CLOUD_TPU_TASK_ID": str(rank),
            "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
        }
        if not one_chip_host:
            expected["TPU_VISIBLE_CHIPS"] = str(local)
        assert env.rank == rank and env.process_id == rank
        assert dict(env.set) == expected
        assert env.remove == (() if one_chip_host
                              else ("TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS"))
        assert layout.for_rank(rank) is env


def test_v4_16_second_host_matches_pytorch_xla():
    # test_internal_tpu.py, v4-16_worker_1_process_0: task 4, port 8476, chip 0.
    layout = chip_layout(parse_shape("v4", "2x2x2"), _reports(2, [0, 1, 2, 3]))
    assert dict(layout.for_rank(4).set) == {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "2,2,2",
        "TPU_PROCESS_ADDRESSES": "10.0.0.1:8476,10.0.0.1:8477,10.0.0.1:8478,10.0.0.1:8479,"
                                 "10.0.0.2:8476,10.0.0.2:8477,10.0.0.2:8478,10.0.0.2:8479",
        "TPU_PROCESS_PORT": "8476",
        "CLOUD_TPU_TASK_ID": "4",
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
        "TPU_VISIBLE_CHIPS": "0",
    }


def _shuffled(hosts: int, chips: list[int], seed: int) -> list[ChipProcess]:
    """Ranks hold chips in an arbitrary order; each process's ports follow it
    (9000 + 10 * worker + chip), so the expected addresses can be written by chip."""
    rng = random.Random(seed)
    ranks = list(range(hosts * len(chips)))
    rng.shuffle(ranks)
    reports = []
    for worker in range(hosts):
        for chip in chips:
            reports.append(ChipProcess(
                rank=ranks.pop(), worker_id=worker, address=_host_ip(worker),
                environment={"TPU_VISIBLE_CHIPS": str(chip), **RAY_ONE_CHIP},
                tpu_port=9000 + 10 * worker + chip, coordinator_port=9500 + 10 * worker + chip))
    rng.shuffle(reports)
    return reports


# (worker, chip) -> process id, by hand: host-major, then the chip's place among its
# host's chips, sorted.
V6E_4X4_FROM_1 = {
    (0, 1): 0, (0, 2): 1, (0, 3): 2, (0, 4): 3,
    (1, 1): 4, (1, 2): 5, (1, 3): 6, (1, 4): 7,
    (2, 1): 8, (2, 2): 9, (2, 3): 10, (2, 4): 11,
    (3, 1): 12, (3, 2): 13, (3, 3): 14, (3, 4): 15,
}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_shuffled_bundles_keep_each_chips_process_id(seed):
    reports = _shuffled(4, [1, 2, 3, 4], seed)
    layout = chip_layout(parse_shape("v6e", "4x4"), reports)
    for report in reports:
        env = layout.for_rank(report.rank)
        chip = int(report.environment["TPU_VISIBLE_CHIPS"])
        assert env.process_id == V6E_4X4_FROM_1[(report.worker_id, chip)]
        assert env.set["CLOUD_TPU_TASK_ID"] == str(env.process_id)
        assert env.set["TPU_VISIBLE_CHIPS"] == str(chip)
        assert env.set["TPU_PROCESS_PORT"] == str(report.tpu_port)
        assert env.set["TPU_PROCESS_ADDRESSES"] == (
            "10.0.0.1:9001,10.0.0.1:9002,10.0.0.1:9003,10.0.0.1:9004,"
            "10.0.0.2:9011,10.0.0.2:9012,10.0.0.2:9013,10.0.0.2:9014,"
            "10.0.0.3:9021,10.0.0.3:9022,10.0.0.3:9023,10.0.0.3:9024,"
            "10.0.0.4:9031,10.0.0.4:9032,10.0.0.4:9033,10.0.0.4:9034")
    # Process 0 is chip 1 of host 0, whichever rank holds it.
    assert layout.coordinator == "10.0.0.1:9501"


@pytest.mark.parametrize("seed", [0, 1])
def test_shuffled_single_host_with_gaps_in_chip_numbers(seed):
    # A v6e-8 whose chips are numbered from 1 (ray-project/ray#53569).
    reports = _shuffled(1, [1, 2, 3, 4, 5, 6, 7, 8], seed)
    layout = chip_layout(parse_shape("v6e", "2x4"), reports)
    by_chip = {int(r.environment["TPU_VISIBLE_CHIPS"]): layout.for_rank(r.rank).process_id
               for r in reports}
    assert by_chip == {1: 0, 2: 1, 3: 2, 4: 3, 5: 4, 6: 5, 7: 6, 8: 7}
    reports = _shuffled(2, [0, 2, 5, 7], seed)
    layout = chip_layout(parse_shape("v5p", "2x2x2"), reports)
    by_chip = {(r.worker_id, int(r.environment["TPU_VISIBLE_CHIPS"])):
               layout.for_rank(r.rank).process_id for r in reports}
    assert by_chip == {(0, 0): 0, (0, 2): 1, (0, 5): 2, (0, 7): 3,
                       (1, 0): 4, (1, 2): 5, (1, 5): 6, (1, 7): 7}


def test_apply_removes_then_sets():
    layout = chip_layout(parse_shape("v6e", "2x2"), _reports(1, [0, 1, 2, 3]))
    environ = {"TPU_VISIBLE_CHIPS": "2", "TPU_WORKER_ID": "0", "OTHER": "kept", **RAY_ONE_CHIP}
    layout.for_rank(2).apply(environ)
    assert environ == {
        "OTHER": "kept",
        "TPU_WORKER_ID": "0",
        "TPU_VISIBLE_CHIPS": "2",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "2,2,1",
        "TPU_PROCESS_ADDRESSES": "10.0.0.1:8476,10.0.0.1:8477,10.0.0.1:8478,10.0.0.1:8479",
        "TPU_PROCESS_PORT": "8478",
        "CLOUD_TPU_TASK_ID": "2",
        "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    }


def test_layouts_are_immutable_hashable_and_picklable():
    layout = chip_layout(parse_shape("v5p", "2x2x2"), _reports(2, [0, 1, 2, 3]))
    assert pickle.loads(pickle.dumps(layout)) == layout
    assert hash(pickle.loads(pickle.dumps(layout))) == hash(layout)
    env = layout.for_rank(0)
    with pytest.raises(TypeError):
        env.set["TPU_PROCESS_PORT"] = "1"  # type: ignore[index]
    given = {"A": "1"}
    made = ProcessEnvironment(rank=0, process_id=0, set=given, remove=["B"])
    given["A"] = "2"
    assert dict(made.set) == {"A": "1"} and made.remove == ("B",)
    assert isinstance(layout, MeshLayout)


def test_ipv6_addresses_are_bracketed():
    reports = [ChipProcess(rank=0, worker_id=0, address="fd00::1", environment={},
                           tpu_port=8476, coordinator_port=9476)]
    layout = chip_layout(parse_shape("v6e", "1x1"), reports)
    assert layout.coordinator == "[fd00::1]:9476"
    assert layout.for_rank(0).set["TPU_PROCESS_ADDRESSES"] == "[fd00::1]:8476"


def test_every_catalog_shape_but_v7x_has_consistent_bounds():
    for shape in all_shapes():
        if shape.generation.name == "v7x":
            continue
        chips, hosts = host_chip_bounds(shape), host_bounds(shape)
        assert chips[0] * chips[1] * chips[2] == shape.chips_per_host, shape.label
        assert hosts[0] * hosts[1] * hosts[2] == shape.hosts, shape.label


def test_larger_multi_host_bounds():
    assert host_bounds(parse_shape("v6e", "2x8")) == (1, 4, 1)
    assert host_bounds(parse_shape("v5e", "8x16")) == (4, 8, 1)
    assert host_bounds(parse_shape("v4", "2x4x4")) == (1, 2, 4)
    assert host_bounds(parse_shape("v5p", "4x4x4")) == (2, 2, 4)


def _raises(match: str, shape: str, reports: list[ChipProcess]) -> str:
    generation, topology = shape.split()
    with pytest.raises(ProcessLayoutError, match=match) as info:
        chip_layout(parse_shape(generation, topology), reports)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_v7x_is_refused_with_what_is_valid():
    shape = parse_shape("v7x", "2x2x2")
    for call in (host_chip_bounds, host_bounds):
        with pytest.raises(ProcessLayoutError, match="not supported yet.*host layout"):
            call(shape)
    message = _raises("not supported yet", "v7x 2x2x2", _reports(2, [0, 1, 2, 3]))
    assert "v4, v5e, v5p, v6e" in message


def test_wrong_number_of_processes():
    _raises("16 chips .4 host.s. of 4.*12 processes", "v6e 4x4", _reports(3, [0, 1, 2, 3]))
    _raises("1 chips .*2 processes", "v6e 1x1", _reports(2, [0], one_chip_host=True))


def test_missing_or_several_visible_chips():
    reports = _reports(1, [0, 1, 2, 3])
    no_mask = _replace(reports, 2, environment=dict(RAY_ONE_CHIP))
    message = _raises("rank 2 .host 0. has no TPU_VISIBLE_CHIPS", "v6e 2x2", no_mask)
    assert "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS" in message
    _raises("no TPU_VISIBLE_CHIPS", "v6e 2x2",
            _replace(reports, 0, environment={"TPU_VISIBLE_CHIPS": " "}))
    _raises("exactly one chip", "v6e 2x2",
            _replace(reports, 1, environment={"TPU_VISIBLE_CHIPS": "0,1"}))
    _raises("exactly one chip", "v6e 2x2",
            _replace(reports, 1, environment={"TPU_VISIBLE_CHIPS": "one"}))


def test_duplicate_chips_on_a_host():
    reports = _replace(_reports(2, [0, 1, 2, 3]), 6, environment={"TPU_VISIBLE_CHIPS": "1"})
    _raises(r"Host 1 has chip\(s\) \[1\] in more than one", "v5p 2x2x2", reports)


def test_a_host_with_missing_processes():
    reports = _replace(_reports(4, [0, 1, 2, 3]), 13, worker_id=2, address=_host_ip(2),
                       environment={"TPU_VISIBLE_CHIPS": "3"})
    _raises(r"Host 2 of v6e 4x4 has 5 processes .*4 chips", "v6e 4x4", reports)


def test_worker_ids_out_of_range():
    _raises("worker ids 0..3", "v6e 4x4", _replace(_reports(4, [0, 1, 2, 3]), 15, worker_id=4))
    _raises("worker ids 0..0", "v6e 2x2", _replace(_reports(1, [0, 1, 2, 3]), 0, worker_id=-1))


def test_duplicate_and_out_of_range_ranks():
    reports = _replace(_reports(2, [0, 1, 2, 3]), 7, rank=3)
    _raises("Rank 3 was reported twice", "v4 2x2x2", reports)
    _raises("valid ranks for v4 2x2x2 are 0..7", "v4 2x2x2",
            _replace(_reports(2, [0, 1, 2, 3]), 7, rank=8))
    layout = chip_layout(parse_shape("v4", "2x2x1"), _reports(1, [0, 1, 2, 3]))
    with pytest.raises(ProcessLayoutError, match="valid ranks are 0 to 3"):
        layout.for_rank(4)


def test_port_collisions():
    reports = _reports(2, [0, 1, 2, 3])
    _raises("Ranks 4 and 6 on host 1 both chose tpu_port 8476", "v5p 2x2x2",
            _replace(reports, 6, tpu_port=8476))
    _raises("tpu_port 8471, libtpu's default", "v5p 2x2x2",
            _replace(reports, 5, tpu_port=8471))
    # 9477 is the coordinator port rank 1 picked on host 0.
    _raises("rank 2 on host 0 chose tpu_port 9477, the coordinator port that rank 1",
            "v5p 2x2x2", _replace(reports, 2, tpu_port=9477))
    _raises("the coordinator port that rank 5", "v5p 2x2x2", _replace(reports, 5, tpu_port=9477))
    _raises("from 1 to 65535", "v5p 2x2x2", _replace(reports, 3, tpu_port=0))
    _raises("from 1 to 65535", "v5p 2x2x2", _replace(reports, 3, coordinator_port=70000))


def test_address_problems():
    reports = _reports(2, [0, 1, 2, 3])
    _raises("Host 1 reported several addresses", "v5p 2x2x2",
            _replace(reports, 5, address="10.0.0.9"))
    _raises("IP address", "v5p 2x2x2", _replace(reports, 5, address=""))
    _raises("IP address", "v5p 2x2x2", _replace(reports, 5, address="10.0.0.2,10.0.0.3"))


def test_simulated_hosts_may_share_an_address():
    # A loopback cluster's hosts share one IP and may pick the same ports: the CPU
    # backend starts no libtpu, so only ports on one host are checked.
    reports = [_replace(_reports(2, [0, 1, 2, 3]), r, address="127.0.0.1")[r]
               for r in range(8)]
    layout = chip_layout(parse_shape("v5p", "2x2x2"), reports)
    assert layout.coordinator == "127.0.0.1:9476"
    assert layout.for_rank(5).process_id == 5
