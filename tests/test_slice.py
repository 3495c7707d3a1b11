"""Reserving slices of the simulated GKE TPU cluster through Ray's slice_placement_group."""

from __future__ import annotations

import time

import psutil
import pytest
import ray
from support.cluster_state import live_actors, live_placement_groups

import workbench as wb
from workbench.tpu.placement import probe_chips

# Every test here uses a simulated cluster (the session's or its own): the slow tier.
pytestmark = pytest.mark.slow


def test_cluster_nodes_look_like_gke_tpu_hosts(cluster):
    hosts = [n for n in ray.nodes() if n["Alive"] and "ray.io/tpu-pod-type" in n["Labels"]]
    assert len(hosts) == 4 + 1 + 1 + 1 + 2
    big = [n for n in hosts if n["Labels"]["ray.io/tpu-pod-type"] == "v6e-16"]
    assert sorted(n["Labels"]["ray.io/tpu-worker-id"] for n in big) == ["0", "1", "2", "3"]
    slice_name = big[0]["Labels"]["ray.io/tpu-slice-name"]
    for node in big:
        assert node["Resources"]["TPU"] == 4
        assert node["Resources"][slice_name] == 1
        assert node["Labels"]["ray.io/tpu-topology"] == "4x4"
        assert node["Labels"]["ray.io/accelerator-type"] == "TPU-V6E"
        assert node["NodeManagerAddress"].startswith("127.")
        is_head = node["Labels"]["ray.io/tpu-worker-id"] == "0"
        assert ("TPU-v6e-16-head" in node["Resources"]) == is_head


def test_list_slices_reports_every_slice_intact_and_free(cluster):
    slices = wb.list_slices()
    assert sorted(s.shape.label for s in slices) == ["v5p 2x2x2", "v6e 2x2", "v6e 2x2",
                                                     "v6e 2x4", "v6e 4x4"]
    assert all(s.intact and s.free for s in slices)


def test_4x4_gives_16_one_chip_bundles_on_4_hosts_each_seeing_its_own_chip(cluster):
    with wb.reserve("v6e", "4x4", timeout_s=60) as tpu_slice:
        assert tpu_slice.num_chips == 16 and len(tpu_slice.chips) == 16
        assert [h.worker_id for h in tpu_slice.hosts] == [0, 1, 2, 3]
        assert len({h.node_id for h in tpu_slice.hosts}) == 4
        assert all(len(h.chips) == 4 for h in tpu_slice.hosts)
        reports = probe_chips(tpu_slice)
        assert {r.tpu_name for r in reports} == {tpu_slice.name}
        for host in tpu_slice.hosts:
            seen = [r for r in reports if r.node_id == host.node_id]
            assert sorted(r.visible_chips for r in seen) == ["0", "1", "2", "3"]
            assert {r.host for r in seen} == {host.worker_id}
        busy = {s.name: s for s in wb.list_slices()}[tpu_slice.name]
        assert busy.intact and not busy.free


def test_single_host_2x4_starts_8_one_chip_actors_with_distinct_chips(cluster):
    @ray.remote(num_cpus=1, resources={"TPU": 1})
    class ChipHolder:
        def chip(self):
            import os

            return os.environ.get("TPU_VISIBLE_CHIPS"), ray.get_runtime_context().get_node_id()

    with wb.reserve("v6e", "2x4", timeout_s=60) as tpu_slice:
        assert tpu_slice.num_hosts == 1 and len(tpu_slice.chips) == 8
        actors = [
            ChipHolder.options(scheduling_strategy=tpu_slice.scheduling(c.rank)).remote()
            for c in tpu_slice.chips
        ]
        seen = ray.get([a.chip.remote() for a in actors], timeout=120)
        assert sorted(chip for chip, _ in seen) == [str(i) for i in range(8)]
        assert len({node for _, node in seen}) == 1
        for actor in actors:
            ray.kill(actor)


def test_two_reservations_get_different_slices_and_a_third_times_out_cleanly(cluster):
    first = wb.reserve("v6e", "2x2", timeout_s=30)
    second = wb.reserve("v6e", "2x2", timeout_s=30)
    try:
        assert first.name != second.name
        assert first.hosts[0].node_id != second.hosts[0].node_id
        started = time.monotonic()
        with pytest.raises(wb.SliceUnavailableError) as info:
            wb.reserve("v6e", "2x2", timeout_s=3)
        assert time.monotonic() - started < 3 + 5
        message = str(info.value)
        assert "v6e-4" in message and "in use" in message and "What to do" in message
        assert len(live_placement_groups()) == 2
    finally:
        first.release()
        second.release()
    assert live_placement_groups() == []


def test_a_shape_the_cluster_lacks_times_out_naming_what_exists(cluster):
    with pytest.raises(wb.SliceUnavailableError, match="has no v4-16 slice.*v6e 4x4"):
        wb.reserve("v4", "2x2x2", timeout_s=2)


@pytest.mark.parametrize(
    "kwargs",
    [dict(generation="v9", topology="2x2"), dict(generation="v6e", topology="4x4; rm -rf /"),
     dict(generation="v6e", topology="2x2", timeout_s=-1),
     dict(generation="v6e", topology="2x2", timeout_s="soon"),
     dict(generation="v6e", topology="2x2", cpus_per_chip=0)],
)
def test_bad_reservations_are_refused_and_leave_nothing(cluster, kwargs):
    with pytest.raises(ValueError):
        wb.reserve(**kwargs)


def test_release_is_idempotent(cluster):
    tpu_slice = wb.reserve("v6e", "2x2", timeout_s=30)
    tpu_slice.release()
    tpu_slice.release()
    assert tpu_slice.released and live_placement_groups() == []


def test_20_reserve_release_cycles_leave_nothing_behind(cluster):
    processes_before = len(cluster.process_ids())
    for _ in range(20):
        with wb.reserve("v6e", "4x4", timeout_s=30) as tpu_slice:
            assert len(tpu_slice.chips) == 16
    assert live_placement_groups() == []
    assert live_actors() == []
    # Ray may keep a prestarted idle worker or two; cycles must not accumulate processes.
    assert len(cluster.process_ids()) <= processes_before + 2


def test_shutdown_leaves_no_process_behind():
    cluster = wb.local_cluster([("v6e", "2x2")], connect=False)
    pids = cluster.process_ids()
    assert len(pids) >= 4  # simulator, GCS, two raylets at least
    cluster.shutdown()
    cluster.shutdown()
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert alive == []
